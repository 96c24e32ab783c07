"""Shortlists: `python tests/benchmarks/shortlist_speed.py -m CKPT [-d DATA_DIR] [--best 10 20 50]
[--methods ibm1 dice] [--files FILE ...] [--batch-size N ...] [--rounds R] [--beam 4] [--lenpen 1.5]
[--threads 2]`.

Learns shortlists of DATA_DIR's training split at --first 100 and each --best: IBM model 1's (what
`nmt shortlist` makes, its time measured) and, for the choice of method, Dice's coefficient
(2 C(s, t) / (C(s) + C(t)) over sentence co-occurrences); with --files, also measures shortlist
files as they are (`data/distill.sh`'s `shortlist.txt`, one of docs/shortlist.md's). Translates
Multi30k's test_2016_flickr plainly and with each, the model loaded once, the translation alone
timed (the plain run before and after the others: the spread is the machine's noise). Prints one
JSON line per run: lines/s, the speed-up over the mean of the plain runs, sacreBLEU and its change,
the number of columns of 64 lines. With --batch-size, all of it at each batch size (sentences; 0:
`nmt translate`'s default batches, by tokens alone) plainly and shortlisted, each against the plain
runs at the default batches. With --rounds R, each shortlist runs R times, each time after a plain
run: the median lines/s, and the median of the R ratios (`paired_speed_up`), which a noisy
machine's drift between runs does not skew.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import sacrebleu
import torch

from nmt_cli.corpus.datadir import DataDir
from nmt_cli.decode.shortlist import Shortlist, make, vocabulary_digest
from nmt_cli.decode.translator import Translator

MULTI30K = Path(os.environ.get("NMT_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data")) / \
    "multi30k"


def dice(data_dir: Path, first: int, best: int) -> Shortlist:
    """The shortlist of Dice's coefficient, written out."""
    data = DataDir.open(data_dir)
    source_vocab, target_vocab = data.vocabularies()
    train = data.split("train")
    pairs, sources, targets = Counter(), Counter(), Counter()
    for i in range(len(train)):
        s, t = set(train.source[i].tolist()), set(train.target[i].tolist()) - {0, 1, 2, 3}
        sources.update(s)
        targets.update(t)
        pairs.update((a, b) for a in s for b in t)
    ranked: dict[int, list[tuple[float, int]]] = {}
    for (a, b), count in pairs.items():
        ranked.setdefault(a, []).append((-2 * count / (sources[a] + targets[b]), b))
    candidates = np.full((len(source_vocab), best), -1, dtype=np.int64)
    for a, scored in ranked.items():
        chosen = [b for _, b in sorted(scored)[:best]]
        candidates[a, :len(chosen)] = chosen
    frequency = np.bincount(np.asarray(train.target.data, dtype=np.int64), minlength=len(target_vocab))
    frequency[:4] = 0
    frequent = np.sort(np.argsort(-frequency, kind="stable")[:first])
    return Shortlist(candidates, frequent, vocabulary_digest(source_vocab.tokens),
                     vocabulary_digest(target_vocab.tokens), len(target_vocab))


def run(translator: Translator, lines: list[str], references: list[str]) -> tuple[float, float, list[str]]:
    start = time.perf_counter()
    outputs = translator.translate(lines)
    seconds = time.perf_counter() - start
    return len(lines) / seconds, sacrebleu.corpus_bleu(outputs, [references]).score, outputs


def measured(model: str, shortlist: Path | None, batch_size: int, search: dict, lines: list[str],
             references: list[str], plain_bleu: float, plain: Translator, rounds: int) -> dict:
    """lines/s and BLEU of `model` with `shortlist` in batches of `batch_size` sentences (0: by
    tokens alone), and the BLEU's change from the plain run's; with `rounds` > 1, the median of
    that many runs, each after a run of the `plain` translator, and the median of their ratios."""
    translator = Translator.load(model, device="cpu", shortlist=shortlist, batch_size=batch_size or None, **search)
    translator.translate(lines[:50])  # warm up
    alone, listed = [], []
    for _ in range(rounds):
        if rounds > 1:
            alone.append(run(plain, lines, references)[0])
        speed, bleu, _ = run(translator, lines, references)
        listed.append(speed)
    result = {"lines_per_s": round(statistics.median(listed), 2), "bleu": round(bleu, 2),
              "bleu_change": round(bleu - plain_bleu, 2)}
    if alone:
        result |= {"paired_speed_up": round(statistics.median(s / a for s, a in zip(listed, alone)), 3),
                   "plain_lines_per_s": [round(a, 2) for a in alone],
                   "listed_lines_per_s": [round(s, 2) for s in listed]}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("-d", "--data", type=Path, help="learn shortlists from this data directory's training split")
    parser.add_argument("--files", type=Path, nargs="+", default=[], help="shortlist files to measure as they are")
    parser.add_argument("-i", "--input", type=Path, default=MULTI30K / "test_2016_flickr.en")
    parser.add_argument("--ref", type=Path, default=MULTI30K / "test_2016_flickr.de")
    parser.add_argument("--first", type=int, default=100)
    parser.add_argument("--best", type=int, nargs="+", default=[10, 20, 50])
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--lenpen", type=float, default=1.5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--methods", nargs="+", choices=("ibm1", "dice"), default=["ibm1", "dice"])
    parser.add_argument("--batch-size", type=int, nargs="+", default=[0])
    parser.add_argument("--rounds", type=int, default=1, help="runs of each shortlist, each after a plain run")
    args = parser.parse_args()
    if args.data is None and not args.files:
        parser.error("give -d DATA_DIR (shortlists to learn) or --files (shortlists made)")
    torch.set_num_threads(args.threads)
    lines = args.input.read_text(encoding="utf-8").splitlines()
    references = args.ref.read_text(encoding="utf-8").splitlines()
    search = {"beam": args.beam, "lenpen": args.lenpen}
    plain = Translator.load(args.model, device="cpu", **search)
    plain.translate(lines[:50])  # warm up
    speed, bleu, _ = run(plain, lines, references)
    base = {"benchmark": "shortlist", "model": args.model, "lines": len(lines), "threads": args.threads, **search}
    print(json.dumps({**base, "run": "plain", "lines_per_s": round(speed, 2), "bleu": round(bleu, 2)}), flush=True)
    speeds, results = [speed], []
    for batch_size in filter(None, args.batch_size):  # the plain runs at each batch size, once
        results.append({**base, "run": "plain", "batch_size": batch_size,
                        **measured(args.model, None, batch_size, search, lines, references, bleu, plain, 1)})
    with tempfile.TemporaryDirectory() as tmp:
        runs = [(str(path), path, Shortlist.load(path), {}) for path in args.files]
        for best in args.best if args.data is not None else []:
            for method in args.methods:
                start = time.perf_counter()
                shortlist = make(args.data, args.first, best) if method == "ibm1" else dice(args.data, args.first,
                                                                                          best)
                learned = time.perf_counter() - start
                path = Path(tmp) / f"{method}-{best}.txt"
                shortlist.save(path)
                runs.append((f"{method} first {args.first} best {best}", path, shortlist,
                             {"learn_s": round(learned, 1)}))
        for name, path, shortlist, learning in runs:
            columns = len(shortlist.columns(plain.engine.source_ids(line) for line in lines[:64]))
            for batch_size in args.batch_size:
                results.append({**base, "run": name, "batch_size": batch_size or None, **learning,
                                "columns_of_64_lines": columns,
                                **measured(args.model, path, batch_size, search, lines, references, bleu, plain,
                                           args.rounds)})
    speed, _, _ = run(plain, lines, references)
    speeds.append(speed)
    print(json.dumps({**base, "run": "plain again", "lines_per_s": round(speed, 2)}), flush=True)
    for result in results:
        print(json.dumps({**result, "speed_up": round(result["lines_per_s"] / (sum(speeds) / len(speeds)), 2)}))


if __name__ == "__main__":
    main()
