"""Preprocessing speed and memory: `python tests/benchmarks/preprocess_speed.py [--repeat K] [--rounds R]`.

Runs `nmt preprocess` on Multi30k en-de (train repeated K times, copies after the first lightly
perturbed by rotating each line's words, so the corpus grows but the vocabulary hardly does), once
per worker count, in a subprocess, and prints one JSON line per run: seconds per stage, lines/s of
tokenize and of BPE+binarize (stage 3's segmentation of the training words plus the binarization
of every split), and the subprocess's peak RSS. With `--rounds`, the worker counts alternate R
times (this machine's speed drifts between runs), and a last line gives, per round, the speed-up
of the last worker count over the first, and the medians. `--lines N` takes only the first N
training pairs, for a quick check.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import SHARED


def make_corpus(out: Path, repeat: int, first: int | None = None) -> int:
    lines = 0
    for lang in ("en", "de"):
        src = (SHARED / "multi30k" / f"train.{lang}").read_text(encoding="utf-8").splitlines()[:first]
        with open(out / f"train.{lang}", "w", encoding="utf-8") as f:
            for k in range(repeat):
                for line in src:
                    words = line.split()
                    shift = k % max(1, len(words))
                    f.write(" ".join(words[shift:] + words[:shift]) + "\n")
        lines = repeat * len(src)
        for split in ("val", "test_2016_flickr"):
            (out / f"{split}.{lang}").write_text((SHARED / "multi30k" / f"{split}.{lang}").read_text(encoding="utf-8"))
    return lines


def run(corpus: Path, workers: int, merges: int) -> dict:
    dest = corpus / f"out{workers}"
    command = [sys.executable, "-m", "nmt_cli", "preprocess", "-s", "en", "-t", "de",
               "--trainpref", str(corpus / "train"), "--validpref", str(corpus / "val"),
               "--testpref", str(corpus / "test_2016_flickr"), "--destdir", str(dest),
               "--bpe-merges", str(merges), "--workers", str(workers), "--quiet", "--force"]
    start = time.perf_counter()
    process = subprocess.Popen(command)
    _, status, usage = os.wait4(process.pid, 0)  # this run's own peak RSS (its workers included)
    wall = time.perf_counter() - start
    if status:
        raise SystemExit(f"nmt preprocess failed with status {status}")
    meta = json.loads((dest / "meta.json").read_text())
    train = meta["splits"]["train"]
    t = meta["timings"]
    # BPE application: each distinct training word in stage 3 ("vocabulary"), then every line of
    # every split as it is binarized.
    bpe_binarize_s = t["vocabulary"] + sum(v for k, v in t.items() if k.startswith("binarize_"))
    lines = sum(split["pairs_out"] for split in meta["splits"].values())
    return {
        "benchmark": "preprocess_speed", "workers": workers, "bpe_merges": merges, "train_pairs": train["pairs_in"],
        "wall_s": round(wall, 2), "stages_s": t,
        "tokenize_lines_per_s": round(train["pairs_in"] / t["tokenize_train"]),
        "bpe_binarize_s": round(bpe_binarize_s, 2), "bpe_binarize_lines_per_s": round(lines / bpe_binarize_s),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--bpe-merges", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--lines", type=int, default=None, help="only the first LINES training pairs (a quick check)")
    args = parser.parse_args()
    speedups: dict[str, list[float]] = {"bpe_binarize": [], "tokenize": []}
    with tempfile.TemporaryDirectory() as tmp:
        make_corpus(Path(tmp), args.repeat, args.lines)
        for _ in range(args.rounds):
            runs = [run(Path(tmp), workers, args.bpe_merges) for workers in args.workers]
            for r in runs:
                print(json.dumps(r), flush=True)
            first, last = runs[0], runs[-1]
            speedups["bpe_binarize"].append(round(first["bpe_binarize_s"] / last["bpe_binarize_s"], 2))
            speedups["tokenize"].append(round(last["tokenize_lines_per_s"] / first["tokenize_lines_per_s"], 2))
    if args.rounds > 1:
        print(json.dumps({"benchmark": "preprocess_speedup", "workers": [args.workers[0], args.workers[-1]],
                          "per_round": speedups, "median": {k: statistics.median(v) for k, v in speedups.items()}}))


if __name__ == "__main__":
    main()
