"""Translation quality on Multi30k en->de after a time budget:
`python tests/benchmarks/quality_multi30k.py --work runs/quality --minutes 60 --eval-at 25 60`.

Runs data/quickstart.sh (the recipe lives there) for `--minutes`, keeping every checkpoint (one
every `--save-every` minutes and one at each epoch's end). For each time T in `--eval-at`, the
last 5 checkpoints written within T minutes of training are averaged (the quickstart's rate
reaches 0 at the end of `--minutes`, so for an earlier T this is the same run's state, not a
T-minute run's), then val and test_2016_flickr are translated with beam 4 / alpha 1.5 (the
quickstart's) and scored with sacreBLEU (13a, detokenized). The last checkpoint alone is scored
too, and with `--ema-decay D` the same run keeps an exponential moving average of its weights,
scored at the end of training (`ema`): EMA against last-5 averaging in the same time.
`--subword-args` replaces the quickstart's subwords (Moses + 8,000 BPE merges), e.g. "--subword
sentencepiece --vocab-size 8000 --sentencepiece-samples 10". `--lenpen A [B ...]` scores each
length penalty (the first under the plain keys, the others with `_aB`). `--hold-out K` trains on
all but every K-th pair of train, which become one more test set (`heldout`), never tuned on. One
JSON line per T.

`--train-args` passes more `nmt train` flags (a candidate recipe). Runs side by side on shared
cores can be compared at a fixed number of updates instead of a time: `--train-args
"--max-updates 5500 --save-interval-updates 367" --save-every 1000 --minutes 1000 --eval-at 1000`
(about the updates of the quickstart's 25 minutes on 2 idle AVX512-BF16 cores; a checkpoint every
1/15 of them and, as in the quickstart, at each epoch's end).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import sacrebleu

from nmt_cli.model import checkpoint as ckpt
from nmt_cli.model.averaging import average
from nmt_cli.train.savedir import numbered

ROOT = Path(__file__).resolve().parents[2]


def nmt(*args: object) -> None:
    subprocess.run([sys.executable, "-m", "nmt_cli", *map(str, args)], check=True)


def evaluate(work: Path, minutes: float, threads: int, whole_run: bool, lenpens: list[float], splits: list[str],
             ema: bool) -> dict:
    """Scores of the average of the last 5 checkpoints written within `minutes` (all of them for
    the whole run: its last one is written after the final validation, past the budget)."""
    within = numbered(work / "ckpt")
    if not whole_run:
        within = [(n, path) for n, path in within if ckpt.load(path)["progress"]["elapsed_s"] <= minutes * 60]
    result: dict = {"benchmark": "quality_multi30k", "minutes": minutes, "updates": within[-1][0],
                    "averaged": [n for n, _ in within[-5:]]}
    ckpt.save(average([path for _, path in within[-5:]]), work / f"avg{minutes:g}.pt")
    models = [("avg5", work / f"avg{minutes:g}.pt"), ("last", within[-1][1])]
    models += [("ema", work / "ckpt/checkpoint_ema.pt")] if ema else []
    for (name, model), split, lenpen in itertools.product(models, splits, lenpens):
        suffix = "" if lenpen == lenpens[0] else f"_a{lenpen:g}"
        hyp = work / f"{split}.{name}{minutes:g}{suffix}.de"
        nmt("translate", "-m", model, "-i", work / f"raw/{split}.en", "-o", hyp, "--threads", threads,
            "--lenpen", lenpen)
        refs = (work / f"raw/{split}.de").read_text(encoding="utf-8").splitlines()
        hyps = hyp.read_text(encoding="utf-8").splitlines()
        result[f"{split}_{name}_bleu{suffix}"] = round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)
    return result


def hold_out(work: Path, every: int) -> Path:
    """Every `every`-th pair of Multi30k's train as raw/heldout.{en,de}; the prefix of the rest."""
    raw, rest = work / "raw", work / "train_rest"
    subprocess.run(["bash", str(ROOT / "data/get_multi30k.sh"), str(raw)], check=True)
    for lang in ("en", "de"):
        lines = (raw / f"train.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)
        (raw / f"heldout.{lang}").write_text("".join(lines[::every]), encoding="utf-8")
        Path(f"{rest}.{lang}").write_text("".join(line for i, line in enumerate(lines) if i % every),
                                          encoding="utf-8")
    return rest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", type=Path, default=Path("runs/quality"))
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--eval-at", type=float, nargs="+", default=[25, 60])
    parser.add_argument("--save-every", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--ema-decay", type=float, default=0.0)
    parser.add_argument("--subword-args", default="--bpe-merges 8000", help="nmt preprocess flags for the subwords")
    parser.add_argument("--train-args", default="", help="more nmt train flags (a candidate recipe)")
    parser.add_argument("--lenpen", type=float, nargs="+", default=[1.5], help="length penalties to score (the "
                        "first: the quickstart's)")
    parser.add_argument("--hold-out", type=int, default=0, help="train without every K-th pair, a test set")
    args = parser.parse_args()
    env = {**os.environ, "WORK": str(args.work.resolve()), "MINUTES": f"{args.minutes:g}",
           "SAVE_EVERY": f"{args.save_every:g}", "KEEP_LAST": "0", "THREADS": str(args.threads),
           "TRAIN_ARGS": (f"--ema-decay {args.ema_decay:g} " if args.ema_decay else "") + args.train_args,
           "SUBWORD_ARGS": args.subword_args}
    splits = ["val", "test_2016_flickr"]
    if args.hold_out:
        env["TRAINPREF"] = str(hold_out(args.work.resolve(), args.hold_out))
        splits.append("heldout")
    subprocess.run(["bash", str(ROOT / "data/quickstart.sh")], check=True, env=env)
    for minutes in args.eval_at:
        whole_run = minutes >= args.minutes
        ema = bool(args.ema_decay) and whole_run  # the moving average is known at the end only
        print(json.dumps(evaluate(args.work, minutes, args.threads, whole_run, args.lenpen, splits, ema)), flush=True)


if __name__ == "__main__":
    main()
