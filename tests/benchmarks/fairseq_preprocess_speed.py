"""Preprocessing side by side: `python tests/benchmarks/fairseq_preprocess_speed.py --fairseq-bin VENV/bin`.

The pipeline of the speed issue's reference, on Multi30k en-de (train, val, test_2016_flickr):
the six files Moses-tokenized beforehand (not timed; by nmt-cli's own tokenizer, so both pipelines
see the same words), then, timed, `subword-nmt learn-bpe` (8,000 merges on train.en + train.de),
`subword-nmt apply-bpe` on the six files one after the other, and `fairseq-preprocess
--joined-dictionary --workers W`. Beside it, `nmt preprocess --workers W` from the raw files,
tokenization included, with its own stage timings. Prints one JSON line per pipeline. ROUNDS
alternates the two. fairseq is not a dependency of nmt-cli: see fairseq_train_speed.py.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import SHARED

from nmt_cli.config import TextConfig
from nmt_cli.text.processor import TextProcessor

SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}


def tokenize(raw: Path, out: Path) -> None:
    for lang in ("en", "de"):
        processor = TextProcessor(TextConfig("en", "de"), lang)
        for name, split in SPLITS.items():
            lines = (SHARED / "multi30k" / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
            (raw / f"{name}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
            (out / f"{name}.{lang}").write_text(
                "\n".join(" ".join(processor.tokenize(line)) for line in lines) + "\n", encoding="utf-8")


def timed(command: list, stdin: Path | None = None, stdout: Path | None = None) -> float:
    start = time.perf_counter()
    with open(stdin or "/dev/null", "rb") as fin, open(stdout or "/dev/null", "wb") as fout:
        subprocess.run([str(c) for c in command], stdin=fin, stdout=fout, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def reference(tok: Path, work: Path, fairseq_bin: Path, workers: int, merges: int) -> dict:
    subword_nmt = [Path(sys.executable).parent / "subword-nmt"]  # its console script (no __main__)
    both = work / "train.both"
    both.write_bytes((tok / "train.en").read_bytes() + (tok / "train.de").read_bytes())
    learn = timed([*subword_nmt, "learn-bpe", "-s", merges], stdin=both, stdout=work / "codes")
    (work / "bpe").mkdir()
    apply = sum(timed([*subword_nmt, "apply-bpe", "-c", work / "codes"], stdin=tok / f"{name}.{lang}",
                      stdout=work / "bpe" / f"{name}.{lang}") for name in SPLITS for lang in ("en", "de"))
    if not (work / "bpe/train.en").stat().st_size:
        raise SystemExit("apply-bpe wrote nothing")
    binarize = timed([fairseq_bin / "fairseq-preprocess", "-s", "en", "-t", "de", "--joined-dictionary",
                      "--trainpref", work / "bpe/train", "--validpref", work / "bpe/valid",
                      "--testpref", work / "bpe/test", "--destdir", work / "bin", "--workers", workers])
    return {"benchmark": "fairseq_preprocess_speed", "pipeline": "subword-nmt + fairseq-preprocess",
            "workers": workers, "learn_bpe_s": round(learn, 2), "apply_bpe_s": round(apply, 2),
            "fairseq_preprocess_s": round(binarize, 2), "total_s": round(learn + apply + binarize, 2)}


def ours(raw: Path, work: Path, workers: int, merges: int) -> dict:
    dest = work / "nmt"
    wall = timed([sys.executable, "-m", "nmt_cli", "preprocess", "-s", "en", "-t", "de", "--trainpref", raw / "train",
                  "--validpref", raw / "valid", "--testpref", raw / "test", "--destdir", dest,
                  "--bpe-merges", merges, "--workers", workers, "--quiet"])
    stages = json.loads((dest / "meta.json").read_text())["timings"]
    return {"benchmark": "fairseq_preprocess_speed", "pipeline": "nmt preprocess", "workers": workers,
            "total_s": round(wall, 2), "without_tokenization_s": round(wall - stages["tokenize_train"], 2),
            "stages_s": stages}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fairseq-bin", type=Path, required=True, help="bin/ of the venv holding fairseq")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--bpe-merges", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        raw, tok = Path(tmp) / "raw", Path(tmp) / "tok"
        raw.mkdir()
        tok.mkdir()
        tokenize(raw, tok)
        for round_ in range(args.rounds):
            for run in ("reference", "ours"):
                work = Path(tmp) / f"{run}{round_}"
                work.mkdir()
                result = (reference(tok, work, args.fairseq_bin, args.workers, args.bpe_merges) if run == "reference"
                          else ours(raw, work, args.workers, args.bpe_merges))
                print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
