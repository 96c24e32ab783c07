"""The training log: records, resume truncation, and silence on the processes that are not main."""

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import pytest
from conftest import synthetic_data_dir

from nmt_cli.train.runlog import RunLog


def test_resume_drops_the_records_it_will_redo_and_a_torn_line(tmp_path):
    log = RunLog(tmp_path, main=True, tensorboard=False, progress_bar=False)
    for update in (10, 20, 30):
        log.record({"kind": "train", "update": update})
    with open(tmp_path / "train_log.jsonl", "a") as f:
        f.write('{"kind": "train", "upd')  # killed in the middle of a write
    log.truncate(20)
    lines = (tmp_path / "train_log.jsonl").read_text().splitlines()
    assert [json.loads(line)["update"] for line in lines] == [10, 20]


def test_a_slow_run_reports_after_its_first_update_and_at_least_each_minute(tmp_path, monkeypatch):
    """A large model on a CPU (a minute or more an update) is not silent until --log-interval."""
    from nmt_cli.train import runlog

    now = [1000.0]
    monkeypatch.setattr(runlog.time, "monotonic", lambda: now[0])
    log = RunLog(tmp_path, main=True, tensorboard=False, progress_bar=False)
    log.start(updates=None, initial=0, seconds=None, elapsed=0.0)
    assert log.due(1, 50)  # the first update
    log.count({"loss": 3.0, "nll": 2.0, "tokens": 1.0}, update=1, elapsed=1.0)
    now[0] += 70.0
    log.report(update=1, epoch=1, lr=1e-3, elapsed=70.0, world=1)
    now[0] += 59.0
    assert not log.due(2, 50) and log.due(50, 50)
    now[0] += 1.0
    assert log.due(3, 50)  # a minute since the last report


def test_report_averages_the_window_per_token(tmp_path, capsys):
    log = RunLog(tmp_path, main=True, tensorboard=False, progress_bar=False)
    log.start(updates=None, initial=0, seconds=None, elapsed=0.0)
    log.count({"loss": 30.0, "nll": 20.0, "tokens": 10.0}, update=1, elapsed=0.5)
    log.count({"loss": 10.0, "nll": 0.0, "tokens": 10.0}, update=2, elapsed=1.0)
    log.report(update=2, epoch=1, lr=1e-3, elapsed=1.0, world=1)
    log.close()
    entry = json.loads((tmp_path / "train_log.jsonl").read_text())
    assert (entry["loss"], entry["nll"], entry["update"]) == (2.0, 1.0, 2)
    assert "nmt train: update 2 epoch 1: loss 2.000" in capsys.readouterr().err  # no terminal: a line


def test_other_processes_write_nothing(tmp_path, capsys):
    log = RunLog(tmp_path, main=False, tensorboard=True, progress_bar=True)
    log.log("hello")
    log.record({"kind": "train", "update": 1})
    assert not (tmp_path / "train_log.jsonl").exists() and capsys.readouterr().err == ""


def on_a_terminal(command: list[str], columns: int = 100) -> str:
    """What `command` writes to a pseudo-terminal of `columns` columns, as the raw characters."""
    main_fd, child_fd = pty.openpty()
    fcntl.ioctl(child_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {**os.environ, "COLUMNS": str(columns), "LINES": "40", "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, stdin=child_fd, stdout=child_fd, stderr=child_fd, env=env)
    os.close(child_fd)
    out = b""
    while True:
        try:
            data = os.read(main_fd, 1 << 16)
        except OSError:  # the terminal closed with the process
            break
        if not data:
            break
        out += data
    os.close(main_fd)
    assert process.wait(timeout=60) == 0, out.decode(errors="replace")[-2000:]
    return out.decode("utf-8", errors="replace")


@pytest.mark.slow
def test_on_a_terminal_messages_go_above_the_bar_which_measures_the_time_budget(tmp_path):
    data = synthetic_data_dir(tmp_path)
    out = on_a_terminal([sys.executable, "-m", "nmt_cli", "train", str(data), "--save-dir", str(tmp_path / "ck"),
                         "--arch", "small", "--encoder-layers", "1", "--decoder-layers", "1", "--d-model", "32",
                         "--d-ff", "64", "--heads", "2", "--max-tokens", "200", "--max-time", "0.1",
                         "--validate-interval-updates", "20", "--threads", "1", "--device", "cpu"])
    messages = [m.start() for m in re.finditer("nmt train: ", out)]
    assert len(messages) >= 4  # starting, validations, done
    assert all(start == 0 or out[start - 1] in "\r\n" for start in messages), out  # each at a line's start
    assert re.search(r"update \d+: +\d+%\|", out), out  # the bar counts the --max-time budget in percent
    done = out.index("nmt train: done: reached --max-time 0.1 minutes")
    assert "%|" not in out[done:]  # the bar is not drawn again after the last words
