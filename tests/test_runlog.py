"""The training log: records, resume truncation, and silence on the processes that are not main."""

import json

from nmt_cli.runlog import RunLog


def test_resume_drops_the_records_it_will_redo_and_a_torn_line(tmp_path):
    log = RunLog(tmp_path, main=True, tensorboard=False, progress_bar=False)
    for update in (10, 20, 30):
        log.record({"kind": "train", "update": update})
    with open(tmp_path / "train_log.jsonl", "a") as f:
        f.write('{"kind": "train", "upd')  # killed in the middle of a write
    log.truncate(20)
    lines = (tmp_path / "train_log.jsonl").read_text().splitlines()
    assert [json.loads(line)["update"] for line in lines] == [10, 20]


def test_report_averages_the_window_per_token(tmp_path, capsys):
    log = RunLog(tmp_path, main=True, tensorboard=False, progress_bar=False)
    log.start(total=None, initial=0)
    log.count({"loss": 30.0, "nll": 20.0, "tokens": 10.0})
    log.count({"loss": 10.0, "nll": 0.0, "tokens": 10.0})
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
