"""data/argos.sh, run whole at tiny sizes: raw parallel text to an Argos package that imports
again and scores; missing files are one line naming them."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import NEEDS_CTRANSLATE2, multi30k_lines, write_lines

ROOT = Path(__file__).resolve().parent.parent


def recipe(tmp_path: Path, **settings: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **settings}
    return subprocess.run(["bash", str(ROOT / "data/argos.sh")], env=environment, capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)


@pytest.mark.slow
@NEEDS_CTRANSLATE2
def test_the_recipe_makes_a_package_from_raw_text(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for split, n, part in (("train", 300, "train"), ("val", 20, "val")):
        for lang in ("en", "de"):
            write_lines(raw / f"{split}.{lang}", multi30k_lines(n, lang, part))
    done = recipe(tmp_path, SRC="en", TGT="de", TRAIN="raw/train", VALID="raw/val", WORK="work", VOCAB="200",
                  THREADS="1", MINUTES="5", TRAIN_ARGS="--max-updates 6 --save-interval-updates 1 --max-tokens 300 "
                                                      "--d-model 32 --d-ff 64 --heads 2 --max-positions 300",
                  EXPORT_ARGS="--from-name English --to-name German")
    assert done.returncode == 0, done.stderr[-3000:]
    package = tmp_path / "work/translate-en_de-1_0.argosmodel"
    with zipfile.ZipFile(package) as z:
        assert "translate-en_de-1_0/minisbd/en.onnx" in z.namelist()
        assert b'"from_name": "English"' in z.read("translate-en_de-1_0/metadata.json")
    assert (tmp_path / "work/bleu.txt").read_text().startswith("BLEU")
    assert "argos.sh: " in done.stdout and "is ready" in done.stdout


def test_missing_files_are_named(tmp_path):
    done = recipe(tmp_path, SRC="en", TGT="de", TRAIN="raw/train", VALID="raw/val")
    assert done.returncode == 1 and "argos.sh: raw/train.en: missing" in done.stderr
    done = recipe(tmp_path, TGT="de", TRAIN="raw/train", VALID="raw/val")
    assert done.returncode != 0 and "SRC=en TGT=de TRAIN=raw/train VALID=raw/val bash data/argos.sh" in done.stderr
