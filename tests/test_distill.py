"""data/distill.sh, run whole at tiny sizes: a teacher's translations of the training source,
checked, a student trained on them, shortlisted, quantized and scored; pairs out of order or cut
short are refused. The teacher is a model imported from another toolkit (OpenNMT-py's, with its
SentencePiece text: tests/fixtures/onmt/make.sh), with the data `preprocess --from-model` makes."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli, multi30k_lines, write_lines

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_recipe_distills_a_student_and_refuses_pairs_out_of_order(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for split, n, part in (("train", 80, "train"), ("val", 10, "val"), ("test_2016_flickr", 10, "val")):
        for lang in ("en", "de"):
            write_lines(raw / f"{split}.{lang}", multi30k_lines(n, lang, part))
    onmt = ROOT / "tests/fixtures/onmt/spm"
    made = cli("import", onmt / "model_step_400.pt", "-o", tmp_path / "teacher.pt", "-s", "en", "-t", "de",
               "--sentencepiece", onmt / "spm.model")
    assert made.exit_code == 0, made.output
    made = cli("preprocess", "-s", "en", "-t", "de", "--trainpref", raw / "train", "--validpref", raw / "val",
               "--destdir", tmp_path / "data", "--from-model", tmp_path / "teacher.pt", "--quiet", "--workers", 1)
    assert made.exit_code == 0, made.output
    work = tmp_path / "work"
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                   "TEACHER": "teacher.pt", "TEACHER_DATA": "data", "RAW": "raw", "WORK": "work",
                   "SAMPLE": "50", "THREADS": "1", "MINUTES": "5",
                   "SHORTLIST_ARGS": "--first 3 --best 2",
                   "TRAIN_ARGS": "--max-updates 5 --save-interval-updates 1 --max-tokens 200 --d-model 32 --d-ff 64 "
                                 "--heads 2"}

    def distill() -> subprocess.CompletedProcess:  # from the run's folder, its paths relative to it
        return subprocess.run(["bash", str(ROOT / "data/distill.sh")], env=environment, capture_output=True,
                              text=True, timeout=600, cwd=tmp_path)

    done = distill()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "distill: the teacher translates 50 of the 80 training pairs (SAMPLE)" in done.stderr
    assert "distill: 50 pairs, " in done.stderr and " of 20 spot-checked as translated" in done.stderr
    speed = (work / "speed.txt").read_text()
    assert (work / "bleu.txt").read_text().startswith("BLEU") and "int8, shortlist" in speed
    assert re.search(r"by the teacher, [\d.]+ s by the student: the student [\d.]+ times as fast", speed), speed
    about = json.loads(cli("info", "-m", work / "student.pt", "--json").stdout)
    assert about["layers"] == "3 encoder, 1 decoder"
    distilled = work / "distilled/train-sample50.de"
    lines = distilled.read_text().splitlines()
    write_lines(distilled, lines[1:] + lines[:1])  # shifted by one
    done = distill()
    assert done.returncode == 1 and "the pairs are out of order; remove it and run again" in done.stderr
    write_lines(distilled, lines[:-1])
    done = distill()
    assert done.returncode == 1 and f"{distilled.relative_to(tmp_path)} has 49 lines" in done.stderr


def distill_refusal(tmp_path, **settings) -> subprocess.CompletedProcess:
    """data/distill.sh with these settings, run where it should refuse before any work."""
    environment = {**os.environ, "TEACHER": str(tmp_path / "teacher.pt"), "WORK": str(tmp_path / "work"), **settings}
    done = subprocess.run(["bash", str(ROOT / "data/distill.sh")], env=environment, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    return done


@pytest.mark.parametrize("setting, value, expected", [
    ("NBEST", "0", "a whole number of hypotheses, 1 or more"),
    ("NBEST", "two", "a whole number of hypotheses, 1 or more"),
    ("NBEST", "-1", "a whole number of hypotheses, 1 or more"),
    ("SAMPLE", "0", "a whole number of training pairs, 1 or more"),
    ("SAMPLE", "1e3", "a whole number of training pairs, 1 or more"),
    ("MINUTES", "abc", "a number of minutes above 0"), ("MINUTES", "0", "a number of minutes above 0"),
    ("MINUTES", "1);import os;(1", "a number of minutes above 0"), ("LENPEN", "-1", "a length penalty, 0 or more"),
    ("SPOT_CHECK", "abc", "a whole number of lines to check, 0 or more"),
    ("THREADS", "0", "a whole number of threads, 1 or more")])
def test_a_setting_is_checked_before_any_work(tmp_path, setting, value, expected):
    """Each is pasted into commands and Python: checked first, not found wrong after the teacher's hours."""
    done = distill_refusal(tmp_path, **{setting: value})
    assert done.stderr == f"distill: {setting}={value}: expected {expected}\n"
    assert not (tmp_path / "work").exists()


def test_a_work_folder_of_other_inputs_is_refused(tmp_path):
    """A second run with another SAMPLE in the same WORK would train on the first one's data."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "inputs.txt").write_text(f"TEACHER={tmp_path / 'teacher.pt'} ... SAMPLE=50 NBEST=4 SRC=en TGT=de\n")
    done = distill_refusal(tmp_path, SAMPLE="60")
    assert f"distill: {work} holds the run of other inputs (TEACHER=" in done.stderr
    assert "give another WORK, or remove it" in done.stderr and not (work / "distilled").exists()
