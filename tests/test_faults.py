"""Faults: SIGKILL at random moments (also mid-checkpoint), SIGINT/SIGTERM, a failing process under torchrun,
a node lost from a two-node run."""

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import synthetic_data_dir

from nmt_cli.model import checkpoint as ckpt

UPDATES = 40


def train_command(data: Path, save_dir: Path, max_updates: int = UPDATES) -> list[str]:
    return [sys.executable, "-m", "nmt_cli", "train", str(data), "--save-dir", str(save_dir), "--arch", "small",
            "--encoder-layers", "2", "--decoder-layers", "2", "--d-model", "128", "--d-ff", "512", "--heads", "4",
            "--dropout", "0.1", "--max-tokens", "300", "--max-updates", str(max_updates), "--warmup", "10",
            "--save-interval-updates", "1", "--keep-last", "2", "--threads", "1", "--device", "cpu", "--quiet"]


ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def interruptible() -> None:
    """In a child before it runs: Ctrl-C as in a terminal, even where this test runs with SIGINT
    ignored (a shell's background job), which the child would inherit and Python then keep."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def writing(save_dir: Path) -> bool:
    return any(name.startswith(".checkpoint_") and ".nmt-tmp-" in name for name in os.listdir(save_dir))


def kill_while(process: subprocess.Popen, save_dir: Path, during_write: bool, rng: random.Random) -> bool:
    """SIGKILL `process`, mid-checkpoint-write if asked (and caught); returns whether it was mid-write."""
    deadline = time.monotonic() + 60
    while not (save_dir / "checkpoint_last.pt").exists() and time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        time.sleep(0.01)
    if during_write:
        while time.monotonic() < deadline and process.poll() is None:
            if writing(save_dir):
                process.send_signal(signal.SIGKILL)
                process.wait()
                return True
    else:
        time.sleep(rng.uniform(0.0, 1.0))
    process.send_signal(signal.SIGKILL)
    process.wait()
    return False


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_equals_uninterrupted(tmp_path):
    data = synthetic_data_dir(tmp_path)
    subprocess.run(train_command(data, tmp_path / "straight"), check=True, env=ENV, timeout=300)
    save_dir = tmp_path / "killed"
    save_dir.mkdir()
    rng = random.Random(7)
    mid_write = 0
    for attempt in range(6):
        process = subprocess.Popen(train_command(data, save_dir), env=ENV, stderr=subprocess.DEVNULL)
        mid_write += kill_while(process, save_dir, during_write=attempt % 2 == 0, rng=rng)
        ckpt.load(save_dir / "checkpoint_last.pt")  # never half-written
    assert mid_write >= 1
    subprocess.run(train_command(data, save_dir), check=True, env=ENV, timeout=300)
    a = ckpt.load(tmp_path / "straight/checkpoint_last.pt")
    b = ckpt.load(save_dir / "checkpoint_last.pt")
    assert b["progress"]["updates"] == UPDATES
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert not writing(save_dir)  # the killed runs' temporaries were cleaned up
    updates = [line for line in (save_dir / "train_log.jsonl").read_text().splitlines() if '"valid"' in line]
    assert len(updates) == len(set(updates))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.slow
def test_interrupt_saves_the_current_update_and_says_how_to_resume(tmp_path, sig):
    data = synthetic_data_dir(tmp_path)
    save_dir = tmp_path / "ck"
    command = train_command(data, save_dir, max_updates=100000)
    command[command.index("--save-interval-updates") + 1] = "1000"
    process = subprocess.Popen(command, env=ENV, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (save_dir / "train_log.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 1
    assert "Run the same command again to resume" in stderr
    saved = ckpt.load(save_dir / "checkpoint_last.pt")["progress"]["updates"]
    assert saved >= 1 and f"checkpoint saved at update {saved}" in stderr


@pytest.mark.slow
def test_a_failing_process_stops_the_others(tmp_path):
    data = synthetic_data_dir(tmp_path)
    wrapper = tmp_path / "fail_on_rank1.py"
    wrapper.write_text(
        "from nmt_cli.train import trainer\n"
        "real = trainer.Trainer.update\n"
        "def update(self, batches, tokens, step, counted):\n"
        "    if self.runtime.rank == 1 and step == 3:\n"
        "        raise RuntimeError('injected failure on rank 1')\n"
        "    return real(self, batches, tokens, step, counted)\n"
        "trainer.Trainer.update = update\n"
        "from nmt_cli.cli import main\n"
        "main()\n")
    command = train_command(data, tmp_path / "ck", max_updates=100000)[3:]
    start = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             str(wrapper), *command], env=ENV, capture_output=True, text=True, timeout=240)
    assert result.returncode != 0
    assert "injected failure on rank 1" in result.stderr
    assert time.monotonic() - start < 120


def node_processes(agent: int) -> list[int]:
    """A torchrun agent's workers, then the agent."""
    children = subprocess.run(["pgrep", "-P", str(agent)], capture_output=True, text=True).stdout.split()
    return [*map(int, children), agent]


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "stopped"])
@pytest.mark.slow
def test_a_lost_node_ends_the_other_with_a_line_and_its_checkpoint_intact(tmp_path, how):
    """Node 1's processes killed (gloo sees the closed connection) or stopped (nothing is seen;
    only their silence tells): node 0 ends within --dist-timeout + 30 s, non-zero, with a line
    naming the lost rank and the update, and its last checkpoint loads."""
    from conftest import free_port

    data = synthetic_data_dir(tmp_path)
    port, timeout = free_port(), 5
    command = [*train_command(data, tmp_path / "ck", max_updates=100000)[3:], "--dist-timeout", str(timeout),
               "--save-interval-updates", "5"]
    nodes = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank",
                               str(node), "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port",
                               str(port), "-m", "nmt_cli", *command], env=ENV, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for node in (0, 1)]
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "ck/checkpoint_last.pt").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert nodes[0].poll() is None and nodes[1].poll() is None, "a node ended before the other was lost"
        time.sleep(0.5)  # a few more updates
        for pid in node_processes(nodes[1].pid):  # torchrun starts its workers in their own sessions
            os.kill(pid, how)
        lost = time.monotonic()
        stderr = nodes[0].communicate(timeout=timeout + 30)[1]
        assert time.monotonic() - lost <= timeout + 30
    finally:
        for node in nodes:
            for pid in node_processes(node.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            node.wait()
    ours = [line for line in stderr.splitlines() if line.startswith("Error: ")]
    assert nodes[0].returncode != 0 and len(ours) == 1, stderr
    assert "rank 1 (node 1 on " in ours[0] and "stopped answering" in ours[0], ours[0]
    assert "ending rank 0 (node 0 on " in ours[0] and "at update " in ours[0], ours[0]
    assert ckpt.load(tmp_path / "ck/checkpoint_last.pt")["progress"]["updates"] >= 5


@pytest.mark.parametrize("command", ["translate", "preprocess"])
@pytest.mark.slow
def test_killed_translate_or_preprocess_leaves_nothing_that_looks_complete(tmp_path, command):
    from conftest import SYMBOLS, tiny_checkpoint, write_lines

    rng = random.Random(0)
    lines = [" ".join(rng.choice(SYMBOLS) + rng.choice(SYMBOLS) for _ in range(rng.randint(20, 40)))
             for _ in range(60000)]
    write_lines(tmp_path / "in.src", lines)
    write_lines(tmp_path / "in.tgt", lines)
    if command == "translate":
        model = tiny_checkpoint(tmp_path / "m.pt")
        args = ["translate", "-m", str(model), "-i", str(tmp_path / "in.src"), "-o", str(tmp_path / "out"),
                "--max-len-b", "5", "--threads", "1"]
    else:
        args = ["preprocess", "-s", "src", "-t", "tgt", "--trainpref", str(tmp_path / "in"), "--destdir",
                str(tmp_path / "out"), "--tokenizer", "none", "--bpe-merges", "50", "--workers", "1", "--quiet"]
    process = subprocess.Popen([sys.executable, "-m", "nmt_cli", *args], env=ENV, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".out.nmt-tmp-*")) and time.monotonic() < deadline:
        time.sleep(0.005)
    process.send_signal(signal.SIGSTOP)  # frozen while it writes: no race with its finishing
    assert process.poll() is None and not (tmp_path / "out").exists(), "finished before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (tmp_path / "out").exists() and list(tmp_path.glob(".out.nmt-tmp-*"))
    if command == "translate":  # a short input this time; the stale temporary is cleared
        write_lines(tmp_path / "in.src", lines[:3])
    subprocess.run([sys.executable, "-m", "nmt_cli", *args], env=ENV, check=True, timeout=300)
    assert (tmp_path / "out").exists() and not list(tmp_path.glob(".out.nmt-tmp-*"))


def test_sigterm_to_translate_leaves_nothing_behind(tmp_path):
    from conftest import SYMBOLS, tiny_checkpoint, write_lines

    rng = random.Random(1)
    write_lines(tmp_path / "in.src", [" ".join(rng.choice(SYMBOLS) for _ in range(30)) for _ in range(20000)])
    model = tiny_checkpoint(tmp_path / "m.pt")
    process = subprocess.Popen([sys.executable, "-m", "nmt_cli", "translate", "-m", str(model), "-i",
                                str(tmp_path / "in.src"), "-o", str(tmp_path / "out"), "--threads", "1"], env=ENV,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".out.nmt-tmp-*")) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process.poll() is None, "finished before it could be stopped"
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode != 0 and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.src", "m.pt"]


@pytest.mark.slow
def test_a_failing_checkpoint_write_is_one_line_and_leaves_nothing(tmp_path):
    """A real write error inside torch's zip writer (files limited to 100 kB, as a full disk would)."""
    import resource

    data = synthetic_data_dir(tmp_path)

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

    result = subprocess.run(train_command(data, tmp_path / "ck", max_updates=3), env=ENV, capture_output=True,
                            text=True, timeout=120, preexec_fn=small_files)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "checkpoint_1.pt: cannot write checkpoint (File too large); earlier checkpoints are intact" in result.stderr
    # the log of the updates made (the first is reported); no temporary, no lock, no half checkpoint
    assert [path.name for path in (tmp_path / "ck").iterdir()] == ["train_log.jsonl"]


@pytest.mark.slow
def test_preprocess_on_a_full_disk_and_interrupted_with_workers_says_one_line(tmp_path):
    """Writes that fail (files limited to 20 kB) and Ctrl-C to a run with 2 workers: one line each,
    no traceback, nothing left beside the inputs."""
    import resource

    from conftest import SYMBOLS, write_lines

    rng = random.Random(2)  # many distinct words: learning 3,000 merges takes seconds, time to interrupt it
    lines = [" ".join("".join(rng.choice(SYMBOLS) for _ in range(rng.randint(3, 8))) for _ in range(rng.randint(5, 30)))
             for _ in range(40000)]
    write_lines(tmp_path / "in.src", lines)
    write_lines(tmp_path / "in.tgt", lines)
    args = [sys.executable, "-m", "nmt_cli", "preprocess", "-s", "src", "-t", "tgt", "--trainpref",
            str(tmp_path / "in"), "--destdir", str(tmp_path / "out"), "--tokenizer", "none", "--bpe-merges", "3000",
            "--quiet"]

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    full = subprocess.run(args + ["--workers", "1"], env=ENV, capture_output=True, text=True, timeout=120,
                          preexec_fn=small_files)
    assert full.returncode == 1 and "Traceback" not in full.stderr, full.stderr
    assert "cannot write the data directory (File too large); nothing was written" in full.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.src", "in.tgt"]

    process = subprocess.Popen(args + ["--workers", "2"], env=ENV, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, preexec_fn=interruptible)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".out.nmt-tmp-*")) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.5)
    assert process.poll() is None, "finished before it could be interrupted"
    os.killpg(process.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group
    _, err = process.communicate(timeout=60)
    assert process.returncode != 0 and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.src", "in.tgt"]
