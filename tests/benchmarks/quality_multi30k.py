"""Translation quality on Multi30k en->de after a time budget:
`python tests/benchmarks/quality_multi30k.py --work runs/quality --minutes 60 --eval-at 25 60`.

One training run of `--minutes` keeps every checkpoint (one every `--save-every` minutes). For
each time T in `--eval-at`, the last 5 checkpoints written within T minutes of training are
averaged (the rate schedule does not depend on the budget, so this is what a T-minute run
gives), then val and test_2016_flickr are translated with beam 4 / alpha 0.6 and scored with
sacreBLEU (13a, detokenized). The last checkpoint alone is scored too. One JSON line per T.
Extra arguments after `--` go to `nmt train` (the recipe).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import sacrebleu

from nmt_cli import checkpoint as ckpt

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ["--arch", "small", "--lr-schedule", "inverse-sqrt", "--lr", "1e-3", "--warmup", "400",
          "--max-tokens", "4096"]


def nmt(*args: object) -> None:
    subprocess.run([sys.executable, "-m", "nmt_cli", *map(str, args)], check=True)


def evaluate(work: Path, minutes: float, threads: int) -> dict:
    found = [(ckpt.load(path)["progress"]["elapsed_s"], n, path) for n, path in ckpt.numbered(work / "ckpt")]
    within = [(n, path) for elapsed, n, path in found if elapsed <= minutes * 60 + 1]
    result: dict = {"benchmark": "quality_multi30k", "minutes": minutes, "updates": within[-1][0],
                    "averaged": [n for n, _ in within[-5:]]}
    ckpt.save(ckpt.average([path for _, path in within[-5:]]), work / f"avg{minutes:g}.pt")
    for name, model in (("avg5", work / f"avg{minutes:g}.pt"), ("last", within[-1][1])):
        for split in ("val", "test_2016_flickr"):
            hyp = work / f"{split}.{name}{minutes:g}.de"
            nmt("translate", "-m", model, "-i", work / f"raw/{split}.en", "-o", hyp, "--threads", threads)
            refs = (work / f"raw/{split}.de").read_text(encoding="utf-8").splitlines()
            hyps = hyp.read_text(encoding="utf-8").splitlines()
            result[f"{split}_{name}_bleu"] = round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)
    return result


def main() -> None:
    own, _, recipe = " ".join(sys.argv[1:]).partition(" -- ")
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", type=Path, default=Path("runs/quality"))
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--eval-at", type=float, nargs="+", default=[25, 60])
    parser.add_argument("--save-every", type=float, default=2.0)
    parser.add_argument("--bpe-merges", type=int, default=8000)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args(own.split())
    work = args.work
    subprocess.run(["bash", str(ROOT / "data/get_multi30k.sh"), str(work / "raw")], check=True)
    if not (work / "data/meta.json").exists():
        nmt("preprocess", "-s", "en", "-t", "de", "--trainpref", work / "raw/train", "--validpref", work / "raw/val",
            "--destdir", work / "data", "--bpe-merges", args.bpe_merges, "--max-len-ratio", 3, "--quiet")
    nmt("train", work / "data", "--save-dir", work / "ckpt", *(recipe.split() or RECIPE), "--max-time", args.minutes,
        "--save-interval-minutes", args.save_every, "--keep-last", 0, "--threads", args.threads, "--quiet")
    for minutes in args.eval_at:
        print(json.dumps(evaluate(work, minutes, args.threads)), flush=True)


if __name__ == "__main__":
    main()
