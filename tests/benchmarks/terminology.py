"""Terminology: `python tests/benchmarks/terminology.py -m CKPT [--beam 5] [--threads 2]`.

Translates Multi30k's test_2016_flickr (en->de by default) plainly, then with one constraint per
line: a word of its reference that the plain output lacks (the first of four or more letters;
a line without one has no constraint), and prints one JSON line: the share of constrained lines
whose output holds its word, the sacreBLEU of both outputs, and both times (the translation only,
the model loaded once, the plain one first).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import sacrebleu
import torch

from nmt_cli.translator import Translator

MULTI30K = Path(os.environ.get("NMT_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data")) / \
    "multi30k"


def words(line: str) -> list[str]:
    return [w.strip(".,;:!?\"'()") for w in line.split()]


def term(reference: str, output: str) -> str | None:
    """The first word of four or more letters of `reference` that `output` lacks."""
    have = set(words(output))
    return next((w for w in words(reference) if len(w) >= 4 and w.isalpha() and w not in have), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("-i", "--input", type=Path, default=MULTI30K / "test_2016_flickr.en")
    parser.add_argument("--ref", type=Path, default=MULTI30K / "test_2016_flickr.de")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lines = args.input.read_text(encoding="utf-8").splitlines()
    references = args.ref.read_text(encoding="utf-8").splitlines()
    translator = Translator.load(args.model, device="cpu", threads=args.threads, beam=args.beam)
    start = time.perf_counter()
    plain = translator.translate(lines)
    plain_seconds = time.perf_counter() - start
    terms = [term(ref, out) for ref, out in zip(references, plain)]
    start = time.perf_counter()
    constrained = translator.translate(lines, constraints=[[t] if t else [] for t in terms])
    constrained_seconds = time.perf_counter() - start
    asked = [(t, out) for t, out in zip(terms, constrained) if t]
    print(json.dumps({
        "benchmark": "terminology", "model": args.model, "lines": len(lines), "beam": args.beam,
        "threads": args.threads, "constrained_lines": len(asked),
        "terms_present": round(sum(t in words(out) for t, out in asked) / max(len(asked), 1), 4),
        "bleu_plain": round(sacrebleu.corpus_bleu(plain, [references]).score, 2),
        "bleu_constrained": round(sacrebleu.corpus_bleu(constrained, [references]).score, 2),
        "seconds_plain": round(plain_seconds, 2), "seconds_constrained": round(constrained_seconds, 2),
        "time_ratio": round(constrained_seconds / plain_seconds, 3)}))


if __name__ == "__main__":
    main()
