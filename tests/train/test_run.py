"""`nmt train`: rate, loss, resume, distributed equivalence, refusal, atomic checkpoints."""

import json
import math
import os
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from builders import LEARNER, LEARNER_RECIPE, run_training
from builders import TRAIN_TINY as TINY
from click.testing import CliRunner
from conftest import block_import, synthetic_data_dir

from nmt_cli import device
from nmt_cli.cli import main
from nmt_cli.config import TrainConfig
from nmt_cli.corpus.data import shapes_and_padding
from nmt_cli.errors import NmtError
from nmt_cli.model import checkpoint as ckpt
from nmt_cli.model.architecture import PRESETS
from nmt_cli.text.vocab import PAD_ID
from nmt_cli.train import run as train
from nmt_cli.train import runtime, trainer
from nmt_cli.train.run import TrainingRun
from nmt_cli.train.savedir import numbered
from nmt_cli.train.schedule import learning_rate
from nmt_cli.train.trainer import label_smoothed_loss


def params(save_dir, name="checkpoint_last.pt"):
    return ckpt.load(save_dir / name)["model"]


# ---------------------------------------------------------------------------- the paper's formulas

@pytest.mark.parametrize("config", [TrainConfig(), TrainConfig(lr_schedule="inverse-sqrt", warmup=10),
                                    TrainConfig(lr_schedule="linear", warmup=10, max_updates=100)],
                         ids=["noam", "inverse-sqrt", "linear"])
def test_a_rate_from_the_devices_count_is_the_hosts(config):
    """The rate of a step given as a device tensor (the count of applied updates, not yet read)
    is the rate of that step as a number, in every schedule, --max-time's share included."""
    for step in (1, 5, 10, 50, 100, 150):
        for spent in (0.0, 0.3, 0.99):
            on_device = learning_rate(torch.tensor(float(step), dtype=torch.float64), 512, config, spent)
            assert isinstance(on_device, torch.Tensor)
            assert on_device.item() == pytest.approx(learning_rate(step, 512, config, spent), rel=1e-12, abs=0)


@pytest.mark.parametrize("step", [1, 4000, 16000])
def test_noam_rate_is_equation_3(step):
    expected = 512 ** -0.5 * min(step ** -0.5, step * 4000 ** -1.5)
    assert learning_rate(step, 512, TrainConfig()) == pytest.approx(expected, rel=1e-12)
    assert learning_rate(step, 512, TrainConfig(lr_scale=2.0)) == pytest.approx(2 * expected, rel=1e-12)


def test_noam_peak_value():
    # At step = warmup both branches meet: 512^-0.5 * 4000^-0.5 = 7.0e-4.
    assert learning_rate(4000, 512, TrainConfig()) == pytest.approx(6.987712429686844e-4)


def test_inverse_sqrt_rate():
    config = TrainConfig(lr_schedule="inverse-sqrt", lr=1e-3, warmup=100)
    assert learning_rate(50, 512, config) == pytest.approx(5e-4)
    assert learning_rate(100, 512, config) == pytest.approx(1e-3)
    assert learning_rate(400, 512, config) == pytest.approx(5e-4)


def test_linear_rate_falls_to_zero_at_the_end_of_the_budget():
    config = TrainConfig(lr_schedule="linear", lr=1e-3, warmup=100, max_updates=1000)
    assert learning_rate(50, 512, config) == pytest.approx(5e-4)  # warmup
    assert learning_rate(101, 512, config) == pytest.approx(9e-4)  # 100 of 1,000 updates trained before it
    assert learning_rate(1000, 512, config) == pytest.approx(1e-6)  # the last update
    assert learning_rate(501, 512, config, time_spent=0.75) == pytest.approx(2.5e-4)  # time ran further
    timed = TrainConfig(lr_schedule="linear", lr=1e-3, warmup=100, max_time=10.0)
    assert learning_rate(5000, 512, timed, time_spent=0.2) == pytest.approx(8e-4)
    assert learning_rate(5000, 512, timed, time_spent=1.1) == 0.0
    with pytest.raises(ValueError, match="give --max-updates or --max-time"):
        TrainConfig(lr_schedule="linear", lr=1e-3)


def test_linear_rate_follows_the_clock_all_processes_agree_on(tmp_path, monkeypatch):
    """With --max-time the rate falls with the time trained, as read at each agreement."""
    data = synthetic_data_dir(tmp_path, n_train=200)
    run = run_training(data, tmp_path / "ck", lr_schedule="linear", lr_scale=1.0, lr=1e-3, warmup=1, max_time=1.0,
                       log_interval=1)
    monkeypatch.setattr(run, "elapsed", lambda: 15.0 * run.progress.updates)  # the minute ends after update 4
    assert run.run().updates == 4
    rates = [json.loads(line)["lr"] for line in (tmp_path / "ck/train_log.jsonl").read_text().splitlines()
             if '"train"' in line]
    assert rates == pytest.approx([1e-3, 7.5e-4, 5e-4, 2.5e-4])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])])
def test_a_bf16_update_agrees_with_fp32(tmp_path, device):
    run = run_training(synthetic_data_dir(tmp_path), tmp_path / "ck", LEARNER, device=device, precision="fp32")
    batch = run.train.collate(np.arange(16), 8)
    grads = {}
    for dtype in (torch.float32, torch.bfloat16):
        trainer_ = trainer.Trainer(run.model.eval(), run.config, runtime.Runtime(torch.device(device), dtype))
        run.model.zero_grad()
        loss, _, tokens = trainer_.loss(trainer_.losses, batch)
        (loss / tokens).backward()
        grads[dtype] = (loss.item(), torch.cat([p.grad.flatten() for p in run.model.parameters()]))
    (loss32, grad32), (loss16, grad16) = grads[torch.float32], grads[torch.bfloat16]
    assert loss16 != loss32 and loss16 == pytest.approx(loss32, rel=2e-2)  # bf16 arithmetic, close to fp32's
    assert ((grad16 - grad32).norm() / grad32.norm()).item() < 5e-2
    assert all(p.dtype == torch.float32 for p in run.model.parameters())  # the weights stay fp32


def compiled_loss(compiled: bool):
    """label_smoothed_loss as the trainer runs it: eager (kernels.SmoothedCrossEntropy) or inside
    torch.compile (the plain definition; aot_eager traces it as inductor does, in one graph)."""
    return torch.compile(label_smoothed_loss, backend="aot_eager", fullgraph=True) if compiled else label_smoothed_loss


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_label_smoothed_loss_by_hand(compiled):
    logits = torch.tensor([[[2.0, 0.5, -1.0, 0.0]], [[0.1, 0.2, 0.3, 0.4]]])  # (2, 1, V=4)
    target = torch.tensor([[1], [0]])  # second is padding (PAD_ID = 0)
    loss, nll = compiled_loss(compiled)(logits, target, 0.1)
    x = [2.0, 0.5, -1.0, 0.0]
    logp = [v - math.log(sum(math.exp(u) for u in x)) for v in x]
    expected_nll = -logp[1]
    expected = 0.9 * expected_nll + 0.1 * -sum(logp) / 4
    assert nll.item() == pytest.approx(expected_nll, rel=1e-6)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    # Matches PyTorch's own definition of label smoothing (Szegedy et al.).
    torch_loss = F.cross_entropy(logits[0], target[0], label_smoothing=0.1)
    assert loss.item() == pytest.approx(torch_loss.item(), rel=1e-6)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_label_smoothed_loss_gradient_matches_autograd_of_the_definition(compiled):
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, dtype=torch.float32, requires_grad=True)
    target = torch.randint(1, 11, (3, 5))
    target[2, 3:] = PAD_ID
    weights = torch.rand(())  # the trainer scales the loss before backward
    loss, _ = compiled_loss(compiled)(logits, target, 0.1)
    (loss * weights).backward()
    ours = logits.grad.clone()
    logits.grad = None
    lprobs = F.log_softmax(logits, dim=-1)
    real = (target != PAD_ID).float()
    by_definition = 0.9 * -lprobs.gather(-1, target[..., None]).squeeze(-1) - 0.1 * lprobs.mean(-1)
    ((by_definition * real).sum() * weights).backward()
    assert torch.allclose(ours, logits.grad, atol=1e-6)
    assert ours[2, 3:].abs().max() == 0  # padding gets no gradient


# ---------------------------------------------------------------------------- training runs

@pytest.mark.slow
def test_training_lowers_validation_loss(tmp_path):
    data = synthetic_data_dir(tmp_path, n_train=1000, task="copy")
    run_training(data, tmp_path / "ck", LEARNER, max_updates=150, validate_interval_updates=50, **LEARNER_RECIPE).run()
    records = [json.loads(line) for line in (tmp_path / "ck/train_log.jsonl").read_text().splitlines()]
    valid = [r["nll"] for r in records if r["kind"] == "valid"]
    # the best, not the last: single validations of this fast-learning recipe swing between kernel paths
    assert len(valid) >= 3 and min(valid[1:]) < 1.0 < valid[0] - 1.0
    train = [r for r in records if r["kind"] == "train"]
    assert train and all(r["tokens_per_s"] > 0 and r["lr"] > 0 for r in train)


def test_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path):
    data = synthetic_data_dir(tmp_path)
    model = TINY.replace(dropout=0.1, attention_dropout=0.1)
    run_training(data, tmp_path / "straight", model, max_updates=40, update_freq=2).run()
    # 7 updates, then 23 more (crossing epoch boundaries), then the rest.
    for stop in (7, 30, 40):
        run_training(data, tmp_path / "resumed", model, max_updates=stop, update_freq=2).run()
    assert ckpt.load(tmp_path / "resumed/checkpoint_last.pt")["progress"]["updates"] == 40
    a, b = params(tmp_path / "straight"), params(tmp_path / "resumed")
    assert all(torch.equal(a[k], b[k]) for k in a)
    opt_a = ckpt.load(tmp_path / "straight/checkpoint_last.pt")["optimizer"]["state"]
    opt_b = ckpt.load(tmp_path / "resumed/checkpoint_last.pt")["optimizer"]["state"]
    assert all(torch.equal(opt_a[k]["exp_avg_sq"], opt_b[k]["exp_avg_sq"]) for k in opt_a)


def test_a_fine_tuning_run_resumes_from_its_own_checkpoint_not_from_init_from(tmp_path):
    """Run again with the same --init-from, a fine-tuning run resumes exactly where it stopped."""
    data = synthetic_data_dir(tmp_path)
    run_training(data, tmp_path / "base", max_updates=3).run()
    init = tmp_path / "base/checkpoint_last.pt"
    run_training(data, tmp_path / "straight", init_from=init, max_updates=8).run()
    for stop in (3, 8):
        run_training(data, tmp_path / "resumed", init_from=init, max_updates=stop).run()
    a, b = params(tmp_path / "straight"), params(tmp_path / "resumed")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["tgt_embed.tokens.weight"], params(tmp_path / "base")["tgt_embed.tokens.weight"])


def test_frozen_parts_keep_their_weights_while_the_rest_trains(tmp_path):
    """--freeze: the embeddings, the encoder and a decoder layer as they were; every other weight
    moved. A part the model does not have, or that holds nothing of its own, refused naming it."""
    data = synthetic_data_dir(tmp_path)
    run_training(data, tmp_path / "base", LEARNER, max_updates=2).run()
    init = tmp_path / "base/checkpoint_last.pt"
    tuned = run_training(data, tmp_path / "tuned", LEARNER, init_from=init, max_updates=6,
                         freeze=("embeddings", "encoder", "decoder.0"))
    tuned.run()
    before, after = params(tmp_path / "base"), params(tmp_path / "tuned")
    for name in before:
        frozen = name.startswith(("src_embed.", "tgt_embed.", "encoder_layers.", "decoder_layers.0.")) or \
            name == "output_projection.weight"  # tied: the target embedding
        assert torch.equal(before[name], after[name]) is frozen, name
    assert any(name.startswith("decoder_layers.1.") for name in before)  # something was trained
    for other in (("embeddings",), ("embeddings", "encoder", "decoder.1")):  # decoder.1: the same shapes as decoder.0
        with pytest.raises(NmtError, match="the checkpoint's optimizer trained other parameters than this run would"):
            run_training(data, tmp_path / "tuned", LEARNER, init_from=init, max_updates=8, freeze=other)
    for parts, message in ((("decoder.2",), "--freeze decoder.2: expected embeddings, output, encoder, decoder, "
                                            "encoder.N \\(N from 0 to 1\\) or decoder.N \\(to 1\\)"),
                           (("output",), "--freeze output: this model has no parameter of its own there"),
                           (("embeddings", "encoder", "decoder"), "nothing is left to train")):
        with pytest.raises(NmtError, match=message):
            run_training(data, tmp_path / "refused", LEARNER, init_from=init, max_updates=6, freeze=parts)


def test_ema_resumes_exactly_and_is_what_validation_measures(tmp_path):
    data = synthetic_data_dir(tmp_path)
    options = {"ema_decay": 0.9, "validate_interval_updates": 10}
    run_training(data, tmp_path / "straight", max_updates=30, **options).run()
    for stop in (13, 30):
        run_training(data, tmp_path / "resumed", max_updates=stop, **options).run()
    a, b = params(tmp_path / "straight", "checkpoint_ema.pt"), params(tmp_path / "resumed", "checkpoint_ema.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    weights = params(tmp_path / "straight")
    assert not all(torch.equal(a[k], weights[k]) for k in a)  # the average is not the weights
    run = run_training(data, tmp_path / "straight", max_updates=30)
    last = [json.loads(line) for line in (tmp_path / "straight/train_log.jsonl").read_text().splitlines()
            if '"valid"' in line][-1]
    run.model.load_state_dict(a)
    assert run.trainer.validate(run.valid, run.valid_batches, 1)["nll"] == pytest.approx(last["nll"], rel=1e-6)


def test_resume_with_different_seed_differs(tmp_path):
    # The equality above is not vacuous: another seed gives other parameters.
    data = synthetic_data_dir(tmp_path)
    run_training(data, tmp_path / "a", max_updates=5).run()
    run_training(data, tmp_path / "b", max_updates=5, seed=2).run()
    a, b = params(tmp_path / "a"), params(tmp_path / "b")
    assert not all(torch.equal(a[k], b[k]) for k in a)


def test_max_updates_is_absolute(tmp_path):
    data = synthetic_data_dir(tmp_path)
    run_training(data, tmp_path / "ck", max_updates=5).run()
    progress = run_training(data, tmp_path / "ck", max_updates=5).run()
    assert progress.updates == 5


def test_mismatched_save_dir_is_refused(tmp_path):
    data = synthetic_data_dir(tmp_path)
    run_training(data, tmp_path / "ck", max_updates=2).run()
    with pytest.raises(NmtError, match=r"model config differs \(d_model: 32 in the checkpoint, 48 now\)"):
        run_training(data, tmp_path / "ck", TINY.replace(d_model=48), max_updates=4)
    other = synthetic_data_dir(tmp_path / "other", task="copy", n_train=50, min_len=1, max_len=2)
    vocab = (other / "dict.src.txt").read_text()
    assert vocab != (data / "dict.src.txt").read_text()
    with pytest.raises(NmtError, match="vocabulary differs"):
        run_training(other, tmp_path / "ck", max_updates=4)
    # --reset starts over; --init-from fine-tunes from the weights.
    once = TrainConfig(max_updates=1, max_tokens=200, device="cpu")
    assert TrainingRun(data, tmp_path / "ck", TINY.replace(d_model=48), once, reset=True,
                       progress_bar=False).run().updates == 1
    fine = TrainingRun(data, tmp_path / "ft", TINY, TrainConfig(max_updates=1, max_tokens=200, device="cpu"),
                       init_from=tmp_path / "ck/checkpoint_2.pt", progress_bar=False)
    assert torch.equal(fine.model.tgt_embed.tokens.weight, params(tmp_path / "ck", "checkpoint_2.pt")[
        "tgt_embed.tokens.weight"])


def test_a_second_run_on_the_same_save_dir_is_refused(tmp_path):
    from nmt_cli.files import DirectoryLock

    data = synthetic_data_dir(tmp_path)
    (tmp_path / "ck").mkdir()
    with DirectoryLock(tmp_path / "ck/.nmt-train.lock", "test"):
        with pytest.raises(NmtError, match=f"save directory .* is in use by process {os.getpid()} on "):
            run_training(data, tmp_path / "ck", max_updates=2).run()
    assert not (tmp_path / "ck/checkpoint_last.pt").exists()
    run_training(data, tmp_path / "ck", max_updates=2).run()  # the lock is gone with its holder
    assert not (tmp_path / "ck/.nmt-train.lock").exists()


def test_crash_while_saving_keeps_previous_checkpoint(tmp_path, monkeypatch):
    data = synthetic_data_dir(tmp_path)
    run_training(data, tmp_path / "ck", max_updates=3).run()
    before = params(tmp_path / "ck")

    def broken_save(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(NmtError, match="cannot write checkpoint \\(No space left on device\\); earlier checkpoints"):
        run_training(data, tmp_path / "ck", max_updates=6).run()
    monkeypatch.undo()
    after = params(tmp_path / "ck")
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not [p for p in (tmp_path / "ck").iterdir() if p.name.startswith(".")]


def test_keep_last_prunes_numbered_checkpoints(tmp_path):
    data = synthetic_data_dir(tmp_path)
    run_training(data, tmp_path / "ck", max_updates=12, save_interval_updates=2, keep_last=3).run()
    assert [n for n, _ in numbered(tmp_path / "ck")] == [8, 10, 12]
    assert (tmp_path / "ck/checkpoint_best.pt").exists()


def test_cli_train_and_usage_errors(tmp_path):
    data = synthetic_data_dir(tmp_path)
    runner = CliRunner()
    result = runner.invoke(main, ["train", str(data), "--save-dir", str(tmp_path / "ck"), "--arch", "small",
                                  "--d-model", "32", "--heads", "2", "--d-ff", "32", "--encoder-layers", "1",
                                  "--decoder-layers", "1", "--max-updates", "2", "--max-tokens", "200", "--quiet"])
    assert result.exit_code == 0, result.output
    assert ckpt.load(tmp_path / "ck/checkpoint_last.pt")["train_config"]["max_tokens"] == 200
    result = runner.invoke(main, ["train", str(data), "--save-dir", str(tmp_path / "x"), "--max-tokens", "0"])
    assert result.exit_code == 2 and "--max-tokens" in result.output
    result = runner.invoke(main, ["train", str(data), "--save-dir", str(tmp_path / "x"), "--max-tokens", "5",
                                  "--arch", "small"])
    assert result.exit_code == 1 and "more than max_tokens=5" in result.output


def cli_train(data, save_dir, *extra):
    return ["-m", "nmt_cli", "train", str(data), "--save-dir", str(save_dir), "--arch", "small", "--d-model", "32",
            "--heads", "2", "--d-ff", "64", "--encoder-layers", "1", "--decoder-layers", "1", "--dropout", "0",
            "--max-tokens", "200", "--max-updates", "10", "--warmup", "5", "--device", "cpu", "--quiet", *extra]


RANK_WEIGHTS = """\
import os
import torch
from nmt_cli.train import run as train
real = train.TrainingRun.run
def run(self):
    progress = real(self)
    torch.save(self.model.state_dict(), os.path.join(os.environ["WEIGHTS"], f"{self.runtime.rank}.pt"))
    return progress
train.TrainingRun.run = run
from nmt_cli.cli import main
main()
"""


def two_nodes(tmp_path, data, updates, weights, c10d=False, node_1=(), data_1=None, codes=(0, 0)):
    """Two torchrun invocations as two nodes on this machine, every rank's final weights written
    to `weights`/RANK.pt. Static rendezvous: node 0 and node 1 each have a save directory of
    their own, as if local to it (node0/, node1/); c10d rendezvous (which numbers the nodes
    itself): both save to node0/, as if shared. `node_1`, `data_1`: node 1's own options (the
    last of an option given twice wins) and data; `codes`: the exit codes expected."""
    import subprocess
    import sys

    from conftest import free_port

    script = tmp_path / "rank_weights.py"
    script.write_text(RANK_WEIGHTS)
    weights.mkdir(exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WEIGHTS": str(weights)}
    port = free_port()
    rendezvous = {node: ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "run"]
                  if c10d else ["--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port)]
                  for node in (0, 1)}
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", *rendezvous[node],
         str(script), *cli_train(data_1 if node and data_1 else data, tmp_path / f"node{0 if c10d else node}",
                                 "--max-updates", str(updates),
                                 "--max-tokens", "190")[2:], *(map(str, node_1) if node else ())],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
    logs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == list(codes), "\n".join(logs)
    return logs


@pytest.mark.slow
def test_two_nodes_that_disagree_end_at_once_with_the_difference_and_ranks(tmp_path):
    """Other options, or another data directory of the same size: both nodes end at the start with
    the same line, not a traceback or a time-out, nor silently diverging replicas."""
    import time

    data, other = synthetic_data_dir(tmp_path), synthetic_data_dir(tmp_path / "other", seed=1)
    start = time.monotonic()
    for node_1, data_1, difference in ((["--lr-scale", 5, "--dropout", 0.3], None, "--dropout: 0.0 on rank 0; 0.3 on "
                                                                                    "rank 1"),
                                       (["--dist-timeout", 300, "--threads", 1], other, "the data directory's files")):
        logs = two_nodes(tmp_path, data, 4, tmp_path / "w", node_1=node_1, data_1=data_1, codes=(1, 1))
        for log in logs:  # (torchrun's agent prints its own traceback of a failed worker)
            assert f"Error: the processes disagree on {difference}" in log and "/nmt_cli/" not in log, log
    assert time.monotonic() - start < 120  # at the start, not after a --dist-timeout


@pytest.mark.slow
def test_two_nodes_train_as_one_process_and_resume_across_process_counts(tmp_path):
    """Two nodes of one process each equal one process with --update-freq 2, through epochs'
    short last updates (15 batches, 2 per update): started with c10d rendezvous and a shared save
    directory, resumed on one process, and back on two nodes (static rendezvous) whose save
    directories are their own, node 1 getting the checkpoint from node 0."""
    import subprocess
    import sys

    data = synthetic_data_dir(tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = [sys.executable, *cli_train(data, tmp_path / "node0", "--update-freq", "2", "--max-tokens", "190")]
    first = "".join(two_nodes(tmp_path, data, 6, tmp_path / "w6", c10d=True))
    assert "node 0 (" in first and "rank 1 = local 0 on cpu" in first
    subprocess.run(one + ["--max-updates", "13"], check=True, env=env, timeout=300)
    back = two_nodes(tmp_path, data, 20, tmp_path / "w20")  # node1/ has no checkpoint: node 0 sends it
    assert "resuming at update 13" in back[0]
    assert not list((tmp_path / "node1").glob("*.pt")), "only global rank 0 writes checkpoints"
    for weights in ("w6", "w20"):
        rank0, rank1 = (torch.load(tmp_path / weights / f"{rank}.pt") for rank in (0, 1))
        assert all(torch.equal(rank0[key], rank1[key]) for key in rank0), f"the ranks differ after {weights}"
    reference = [sys.executable, *cli_train(data, tmp_path / "one", "--update-freq", "2", "--max-tokens", "190")]
    subprocess.run(reference + ["--max-updates", "20"], check=True, env=env, timeout=300)
    nodes, alone = ckpt.load(tmp_path / "node0/checkpoint_last.pt"), ckpt.load(tmp_path / "one/checkpoint_last.pt")
    assert nodes["progress"]["updates"] == alone["progress"]["updates"] == 20
    assert nodes["progress"]["epoch"] == alone["progress"]["epoch"] == 3  # 8 updates an epoch, the 8th short
    for key in alone["model"]:
        assert (nodes["model"][key] - alone["model"][key]).abs().max() <= 1e-5, key


def _agree_in_process(rank: int, init_file: str, flags: list[tuple[bool, ...]], out: str) -> None:
    import torch.distributed as dist

    from nmt_cli.train.runtime import Runtime

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=len(flags))
    agreed = Runtime(torch.device("cpu"), torch.float32, rank=rank, world=len(flags)).agree(*flags[rank])
    dist.destroy_process_group()
    with open(f"{out}.{rank}", "w") as f:
        json.dump(agreed, f)


@pytest.mark.slow
def test_processes_agree_on_each_flag_in_one_all_reduce(tmp_path):
    """A stop, save or time-out seen by any process is seen by all, flag by flag, and the clock is the
    longest elapsed time."""
    import torch.multiprocessing as mp

    flags = [(True, False, False, 61.5), (False, False, True, 60.25)]
    mp.spawn(_agree_in_process, args=(str(tmp_path / "init"), flags, str(tmp_path / "agreed")), nprocs=2)
    for rank in range(2):
        assert json.loads((tmp_path / f"agreed.{rank}").read_text()) == [1.0, 0.0, 1.0, 61.5]


@pytest.mark.slow
def test_eval_bleu_selects_best_checkpoint_by_bleu(tmp_path):
    data = synthetic_data_dir(tmp_path, n_train=1000, task="copy")
    run_training(data, tmp_path / "ck", LEARNER, max_updates=150, validate_interval_updates=75, eval_bleu=True,
                 eval_bleu_beam=2, best_checkpoint_metric="bleu", **LEARNER_RECIPE).run()
    valid = [json.loads(line) for line in (tmp_path / "ck/train_log.jsonl").read_text().splitlines()
             if '"valid"' in line]
    assert all("bleu" in r for r in valid) and max(r["bleu"] for r in valid) > 50 > valid[0]["bleu"]
    best = ckpt.load(tmp_path / "ck/checkpoint_best.pt")["progress"]
    assert best["best_valid_bleu"] == max(r["bleu"] for r in valid)
    with pytest.raises(ValueError, match="needs eval_bleu"):
        TrainConfig(best_checkpoint_metric="bleu")


def test_ter_selects_the_best_checkpoint_lowest_first(tmp_path):
    data = synthetic_data_dir(tmp_path, n_train=200, n_valid=20, task="copy")
    run_training(data, tmp_path / "ck", max_updates=30, validate_interval_updates=10, eval_bleu=True,
                 eval_bleu_beam=1, best_checkpoint_metric="ter").run()
    valid = [json.loads(line) for line in (tmp_path / "ck/train_log.jsonl").read_text().splitlines()
             if '"valid"' in line]
    assert len(valid) >= 3 and all({"bleu", "chrf", "ter"} <= set(r) for r in valid)
    best = ckpt.load(tmp_path / "ck/checkpoint_best.pt")["progress"]
    assert best["best_valid_ter"] == min(r["ter"] for r in valid)
    assert best["best_valid_chrf"] == max(r["chrf"] for r in valid)
    with pytest.raises(ValueError, match="best_checkpoint_metric=chrf needs eval_bleu"):
        TrainConfig(best_checkpoint_metric="chrf")


def test_non_finite_losses_skip_updates_then_abort(tmp_path, monkeypatch):
    data = synthetic_data_dir(tmp_path)
    run = run_training(data, tmp_path / "ck", max_updates=20)
    real = run.trainer.net.forward
    calls = []

    def sometimes_nan(*args):
        calls.append(1)
        sums = real(*args)
        return tuple(x * float("nan") for x in sums) if len(calls) in (3, 4) or len(calls) >= 10 else sums

    monkeypatch.setattr(run.trainer.net, "forward", sometimes_nan)
    before = {k: v.clone() for k, v in run.model.state_dict().items()}
    with pytest.raises(NmtError, match=r"non-finite loss 5 times in a row \(update 8\): training diverged"):
        run.run()
    assert run.progress.nonfinite_skips == 2 + 5 and run.progress.updates == 9 - 2
    assert all(torch.isfinite(v).all() for v in run.model.state_dict().values())
    assert any(not torch.equal(before[k], v) for k, v in run.model.state_dict().items())


def without_key_bias(name: str, weight: torch.Tensor, d_model: int) -> torch.Tensor:
    """A weight without its keys' bias, if it holds one: that bias shifts every score of a query
    alike, so its gradient is rounding, which Adam scales up to steps of the learning rate's size."""
    if name.endswith("qkv.bias"):
        return torch.cat([weight[:d_model], weight[2 * d_model:]])
    return weight[d_model:] if name.endswith("kv.bias") else weight


@pytest.mark.slow
def test_compiled_update_compiles_once_per_batch_shape(tmp_path, monkeypatch):
    """--compile with --length-buckets: dynamo compiles the model once per batch shape of the
    epoch (its counters), never again for a shape seen, and the updates agree with eager ones. On
    the CPU with the aot_eager backend, which traces forward and backward as inductor does,
    without generating code."""
    from torch._dynamo.utils import counters

    data = synthetic_data_dir(tmp_path)
    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda net, **options: real_compile(net, backend="aot_eager", **options))
    torch._dynamo.reset()
    counters.clear()
    model = TINY.replace(dropout=0.0)  # the same numbers, dropout masks aside
    compiled = run_training(data, tmp_path / "compiled", model, max_updates=40, length_buckets=3, compile=True)
    compiled.run()
    shapes, _ = shapes_and_padding(compiled.train, compiled.batches, 1, compiled.buckets)
    assert len(compiled.buckets) == 3 and 3 <= shapes <= 6 and len(compiled.batches) < 40  # every shape seen
    assert counters["stats"]["unique_graphs"] == shapes and not counters["graph_break"]  # the loss inside
    eager = run_training(data, tmp_path / "eager", model, max_updates=40, length_buckets=3)
    eager.run()
    for (name, a), b in zip(params(tmp_path / "compiled").items(), params(tmp_path / "eager").values()):
        a, b = without_key_bias(name, a, model.d_model), without_key_bias(name, b, model.d_model)
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), name
    losses = [[entry["loss"] for entry in map(json.loads, (tmp_path / run / "train_log.jsonl").read_text().splitlines())
               if entry["kind"] == "train"] for run in ("compiled", "eager")]
    assert len(losses[0]) == 5 and losses[0] == pytest.approx(losses[1], rel=1e-5)


@pytest.mark.slow
def test_a_compiled_update_without_buckets_compiles_once_for_every_shape(tmp_path, monkeypatch):
    """--compile without --length-buckets compiles dynamically from the start: one graph for all
    the batches' shapes rather than one for the first shape and then another."""
    from torch._dynamo.utils import counters

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda net, **options: real_compile(net, backend="aot_eager", **options))
    torch._dynamo.reset()
    counters.clear()
    run = run_training(synthetic_data_dir(tmp_path), tmp_path / "ck", TINY, max_updates=6, compile=True)
    run.run()
    assert len({tuple(run.train.collate(b, 1).src.shape) for b in run.batches[:6]}) > 1
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]


def test_losses_read_every_few_updates_give_the_same_run(tmp_path, monkeypatch):
    """On a GPU the host reads the updates' losses every few updates (device.steps_between_reads),
    not after each: the same run as reading each (the CPU's), non-finite skips found at the read,
    also one in the middle of a window (the 2nd update), whose successors were queued before the
    host knew: their rates are those of the numbers they get, and no number serves twice."""
    data = synthetic_data_dir(tmp_path)
    runs, logs = [], []
    for every in (1, 4):
        monkeypatch.setattr(train, "steps_between_reads", lambda device, every=every: every)
        run = run_training(data, tmp_path / f"ck{every}", max_updates=12, log_interval=4)
        real, calls = run.trainer.net.forward, []

        def nan_at_2_3_and_7(*args, real=real, calls=calls):
            calls.append(1)
            sums = real(*args)
            return tuple(x * float("nan") for x in sums) if len(calls) in (2, 3, 7) else sums

        monkeypatch.setattr(run.trainer.net, "forward", nan_at_2_3_and_7)
        agreed, agree = [], run.runtime.agree
        monkeypatch.setattr(run.runtime, "agree", lambda *flags, agree=agree, agreed=agreed: agreed.append(1) or
                            agree(*flags))
        runs.append(run.run())
        assert len(agreed) == {1: 15, 4: 3}[every]  # time and signals: after each update, or at updates 4, 8, 12
        assert {int(state["step"]) for state in run.trainer.optimizer.state.values()} == {12}  # steps applied
        logs.append([json.loads(line) for line in (tmp_path / f"ck{every}/train_log.jsonl").read_text().splitlines()])
    assert runs[0].updates == runs[1].updates == 12 and runs[0].nonfinite_skips == runs[1].nonfinite_skips == 3
    assert all(torch.equal(a, b) for a, b in zip(params(tmp_path / "ck1").values(), params(tmp_path / "ck4").values()))
    for entries in logs:
        for entry in entries:
            entry.pop("elapsed_s", None), entry.pop("tokens_per_s", None)
    assert logs[0] == logs[1] and [e["update"] for e in logs[0] if e["kind"] == "train"] == [1, 4, 8, 12]


@pytest.mark.parametrize("error", [torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB"),
                                   RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate")])
def test_batches_that_never_fit_in_memory_stop_the_run_with_advice(tmp_path, monkeypatch, capsys, error):
    data = synthetic_data_dir(tmp_path)
    run = run_training(data, tmp_path / "ck", max_epochs=50)
    real, calls = run.trainer.update, []

    def short_of_memory(batches, tokens, step, counted):
        calls.append(step)
        if len(calls) in (2, 3) or len(calls) >= 5:  # two, then every batch from the fifth on
            raise error
        return real(batches, tokens, step, counted)

    monkeypatch.setattr(run.trainer, "update", short_of_memory)
    what = "CUDA out of memory" if isinstance(error, torch.cuda.OutOfMemoryError) else "out of memory"
    with pytest.raises(NmtError) as stopped:
        run.run()
    assert str(stopped.value) == (f"{what} 5 times in a row (update 3): such batches do not fit; lower "
                                  "--max-tokens (and raise --update-freq to keep the update size)")
    assert run.progress.oom_skips == 2 + 5 and run.progress.updates == 2 and len(calls) == 9
    assert f"{what} at update 2: batch skipped (1 so far)" in capsys.readouterr().err


def test_resuming_an_averaged_run_without_its_decay_says_the_average_stops(tmp_path, capsys):
    data = synthetic_data_dir(tmp_path)
    run_training(data, tmp_path / "ck", max_updates=10, ema_decay=0.99).run()
    capsys.readouterr()
    run_training(data, tmp_path / "ck", max_updates=12).run()
    assert "checkpoint_last.pt keeps a weight average (--ema-decay 0.99); this run, without --ema-decay, stops " \
           "averaging and checkpoint_ema.pt stays at update 10: add --ema-decay 0.99" in capsys.readouterr().err


def test_tensorboard_missing_is_a_clear_error(tmp_path, monkeypatch):
    data = synthetic_data_dir(tmp_path)
    block_import(monkeypatch, "torch.utils.tensorboard")
    with pytest.raises(NmtError, match=r"pip install 'nmt-cli\[tensorboard\]' \(or pip install tensorboard\)"):
        run_training(data, tmp_path / "ck", max_updates=1, tensorboard=True)


def test_training_time_accumulates_across_resumes(tmp_path):
    data = synthetic_data_dir(tmp_path)
    run_training(data, tmp_path / "ck", max_updates=3).run()
    first = ckpt.load(tmp_path / "ck/checkpoint_last.pt")["progress"]["elapsed_s"]
    assert first > 0
    run = run_training(data, tmp_path / "ck", max_updates=6)
    assert run.progress.elapsed_s == first
    run.run()
    assert ckpt.load(tmp_path / "ck/checkpoint_last.pt")["progress"]["elapsed_s"] > first
    # --max-time counts the time of earlier runs: a budget already spent stops at once.
    stopped = run_training(data, tmp_path / "ck", max_updates=100, max_time=first / 60 / 2).run()
    assert stopped.updates == 6


@pytest.mark.slow
def test_max_time_stops_training_with_a_final_validation_and_checkpoint(tmp_path):
    import time

    data = synthetic_data_dir(tmp_path)
    start = time.monotonic()
    progress = run_training(data, tmp_path / "ck", max_updates=100000, max_time=2 / 60).run()
    assert time.monotonic() - start < 30
    records = [json.loads(line) for line in (tmp_path / "ck/train_log.jsonl").read_text().splitlines()]
    valid = [r for r in records if r["kind"] == "valid"]
    assert valid[-1]["update"] == progress.updates
    assert sum(r["update"] == progress.updates for r in valid) == 1  # validated once at the end, not every update
    assert ckpt.load(tmp_path / "ck/checkpoint_last.pt")["progress"]["updates"] == progress.updates


def test_fp16_loss_scale_changes_are_reported(tmp_path, capsys):
    from nmt_cli.train.runtime import Runtime
    from nmt_cli.train.trainer import SkipGuard, Trainer

    data = synthetic_data_dir(tmp_path)
    run = run_training(data, tmp_path / "ck", max_updates=3)
    # fp16 autocast with a GradScaler, on CPU; a huge initial scale overflows the fp16 backward.
    run.trainer = Trainer(run.model, run.config, Runtime(torch.device("cpu"), torch.float16))
    run.trainer.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 60)
    run.guard = SkipGuard(run.trainer, run.progress, run.log)
    run.run()
    assert "fp16 loss scale 1.15292e+18 -> 5.76461e+17 at update 1 (overflow, step skipped)" in capsys.readouterr().err
    records = [json.loads(line) for line in (tmp_path / "ck/train_log.jsonl").read_text().splitlines()]
    assert {"kind": "loss_scale", "update": 1, "before": 2.0 ** 60, "after": 2.0 ** 59} in records


def test_init_from_another_architecture_is_refused(tmp_path):
    data = synthetic_data_dir(tmp_path)
    run_training(data, tmp_path / "ck", max_updates=1).run()
    with pytest.raises(NmtError, match=r"checkpoint_last.pt: --init-from weights do not fit this architecture"):
        TrainingRun(data, tmp_path / "ft", TINY.replace(d_ff=32), TrainConfig(max_tokens=200, device="cpu"),
                    init_from=tmp_path / "ck/checkpoint_last.pt", progress_bar=False)


def test_data_directory_errors(tmp_path):
    with pytest.raises(NmtError, match="meta.json: not found; is .* a directory made by `nmt preprocess`"):
        run_training(tmp_path, tmp_path / "ck", max_updates=1)
    data = synthetic_data_dir(tmp_path)
    with pytest.raises(NmtError, match="training has a sequence of 9 tokens .* more than --max-positions 8"):
        run_training(data, tmp_path / "ck", TINY.replace(max_positions=8), max_updates=1)
    meta = json.loads((data / "meta.json").read_text())
    (data / "meta.json").write_text(json.dumps({**meta, "format_version": 7}))
    with pytest.raises(NmtError, match="data format version 7"):
        run_training(data, tmp_path / "ck", max_updates=1)


def test_adam_is_fused_where_torch_can_and_unfused_where_it_cannot(monkeypatch):
    from nmt_cli.model.transformer import Transformer
    from nmt_cli.train.runtime import Runtime
    from nmt_cli.train.trainer import Trainer

    model = Transformer(LEARNER, 20, 20, PAD_ID, True)
    runtime = Runtime(torch.device("cpu"), torch.float32)
    assert Trainer(model, TrainConfig(), runtime).optimizer.defaults["fused"]
    real_adam = torch.optim.Adam

    def old_torch_adam(params, fused=None, **options):  # torch < 2.4: fused Adam is CUDA-only
        if fused:
            raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of supported devices")
        return real_adam(params, **options)

    monkeypatch.setattr(torch.optim, "Adam", old_torch_adam)
    assert not Trainer(model, TrainConfig(), runtime).optimizer.defaults["fused"]


def test_projecting_every_position_gives_the_loss_and_gradients_of_projecting_real_ones(tmp_path):
    """The GPU's way (no boolean index, padding masked in the loss) against the CPU's."""
    from nmt_cli.train.runtime import Runtime
    from nmt_cli.train.trainer import Trainer

    torch.manual_seed(0)
    run = run_training(synthetic_data_dir(tmp_path), tmp_path / "ck", LEARNER)
    model, cpu, indices = run.model.eval(), run.trainer, np.arange(4)  # eval: both passes see the same net
    assert cpu.losses.project_real_only and not Trainer(model, TrainConfig(), Runtime(
        torch.device("cuda"), torch.float32)).losses.project_real_only
    results = []
    for real_only in (True, False):
        cpu.losses.project_real_only = real_only
        model.zero_grad()
        loss, nll, tokens = cpu.loss(cpu.losses, run.train.collate(indices, 8))  # 4-9 tokens, padded to a multiple of 8
        loss.backward()
        results.append((loss.item(), nll.item(), tokens.item(), [p.grad.clone() for p in model.parameters()]))
    (loss_a, nll_a, tokens_a, grads_a), (loss_b, nll_b, tokens_b, grads_b) = results
    assert tokens_a == tokens_b == run.train.tgt_lengths[indices].sum()  # with EOS, padding excluded
    assert loss_a == pytest.approx(loss_b, rel=1e-5) and nll_a == pytest.approx(nll_b, rel=1e-5)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads_a, grads_b))


def test_training_on_the_cpu_keeps_freed_memory_for_reuse(monkeypatch):
    calls = []
    monkeypatch.setattr(device, "keep_freed_memory", lambda: calls.append(True))
    assert runtime.set_up_runtime(TrainConfig(device="cpu")).device.type == "cpu"
    assert calls == [True]


def test_a_run_saved_in_format_version_1_resumes(tmp_path):
    """tests/train/fixtures/v1_checkpoint_last.pt: 10 updates of a run (--ema-decay 0.9) written by
    nmt-cli at 32915c5, on the synthetic data directory conftest makes; it resumes to 20."""
    import shutil
    from pathlib import Path

    data = synthetic_data_dir(tmp_path)
    (tmp_path / "ck").mkdir()
    shutil.copyfile(Path(__file__).parent / "fixtures/v1_checkpoint_last.pt", tmp_path / "ck/checkpoint_last.pt")
    model = PRESETS["small"].replace(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2,
                                     max_positions=32)
    run = run_training(data, tmp_path / "ck", model, max_updates=20, ema_decay=0.9)
    assert run.resumed and run.progress.updates == 10
    before = {name: p.detach().clone() for name, p in run.model.named_parameters()}
    run.run()
    resumed = ckpt.load(tmp_path / "ck/checkpoint_last.pt")
    assert resumed["progress"]["updates"] == 20 and resumed["format_version"] == 2
    assert all(state["step"] == 20 for state in resumed["optimizer"]["state"].values())  # Adam's state went on
    assert any(not torch.equal(before[name], p) for name, p in run.model.named_parameters())


@pytest.mark.parametrize("slower", ["fp32", "bf16"])
def test_precision_fastest_trains_in_the_precision_measured_faster(tmp_path, monkeypatch, capsys, slower):
    """--precision fastest times a short run in fp32 and in bf16 (where the hardware multiplies
    bf16) and trains in the faster; here the slower one is made slower, whatever this CPU does."""
    monkeypatch.setattr(train, "native_bf16", lambda device: True)
    update, dtypes = trainer.Trainer.update, []

    def timed_update(self, *args, **kwargs):
        dtypes.append(self.runtime.dtype)
        if self.runtime.dtype == device.DTYPES[slower]:
            time.sleep(0.05)
        return update(self, *args, **kwargs)

    monkeypatch.setattr(trainer.Trainer, "update", timed_update)
    run = run_training(synthetic_data_dir(tmp_path), tmp_path / "ck", max_updates=3, precision="fastest")
    faster = {"fp32": "bf16", "bf16": "fp32"}[slower]
    assert run.config.precision == faster and run.runtime.dtype == device.DTYPES[faster]
    assert f"training in {faster}" in capsys.readouterr().err
    run.run()
    assert ckpt.load(tmp_path / "ck/checkpoint_last.pt")["train_config"]["precision"] == faster
    probes = 2 * train.PROBE_UPDATES
    assert dtypes == [torch.float32] * probes + [torch.bfloat16] * probes + [device.DTYPES[faster]] * 3


def test_precision_fastest_is_fp32_without_bf16_hardware_and_refused_under_torchrun(tmp_path, monkeypatch):
    monkeypatch.setattr(train, "native_bf16", lambda device: False)
    data = synthetic_data_dir(tmp_path)
    assert run_training(data, tmp_path / "ck", max_updates=1, precision="fastest").runtime.dtype == torch.float32
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(NmtError, match="--precision fastest measures in one process"):
        run_training(data, tmp_path / "ck2", max_updates=1, precision="fastest")
