"""Terminology: `python tests/benchmarks/terminology.py -m CKPT [--beam 5] [--threads 2] [--terms lacking|reference]`.

Translates Multi30k's test_2016_flickr (en->de by default) plainly, then with one constraint per
line, once by the constrained search alone and once with `--plain-first`, and prints one JSON line:
for each, the share of constrained lines whose output holds its word, the sacreBLEU, the time (the
translation only, the model loaded once, the plain one first), and how many of the lines whose
plain output already held its word kept that output unchanged. The word: with `--terms lacking`
(default) the first word of four or more letters of its reference that the plain output lacks (a
line without one has no constraint); with `--terms reference` the first such word of its reference,
held or not (a glossary's case: many outputs hold their term already).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import sacrebleu
import torch

from nmt_cli.decode.translator import Translator

MULTI30K = Path(os.environ.get("NMT_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data")) / \
    "multi30k"


def words(line: str) -> list[str]:
    return [w.strip(".,;:!?\"'()") for w in line.split()]


def term(reference: str, output: str, lacking: bool) -> str | None:
    """The first word of four or more letters of `reference` (that `output` lacks, if `lacking`)."""
    have = set(words(output)) if lacking else set()
    return next((w for w in words(reference) if len(w) >= 4 and w.isalpha() and w not in have), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("-i", "--input", type=Path, default=MULTI30K / "test_2016_flickr.en")
    parser.add_argument("--ref", type=Path, default=MULTI30K / "test_2016_flickr.de")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--terms", choices=("lacking", "reference"), default="lacking")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    lines = args.input.read_text(encoding="utf-8").splitlines()
    references = args.ref.read_text(encoding="utf-8").splitlines()
    translator = Translator.load(args.model, device="cpu", threads=args.threads, beam=args.beam)
    start = time.perf_counter()
    plain = translator.translate(lines)
    seconds = {"plain": time.perf_counter() - start}
    terms = [term(ref, out, args.terms == "lacking") for ref, out in zip(references, plain)]
    held = [n for n, (t, out) in enumerate(zip(terms, plain)) if t and t in words(out)]
    result = {"benchmark": "terminology", "model": args.model, "lines": len(lines), "beam": args.beam,
              "threads": args.threads, "terms": args.terms, "constrained_lines": sum(map(bool, terms)),
              "held_by_plain": len(held), "bleu_plain": round(sacrebleu.corpus_bleu(plain, [references]).score, 2),
              "seconds_plain": round(seconds["plain"], 2)}
    for name, options in (("constrained", {}), ("plain_first", {"plain_first": True})):
        start = time.perf_counter()
        found = translator.translate(lines, constraints=[[t] if t else [] for t in terms], **options)
        seconds[name] = time.perf_counter() - start
        asked = [(t, out) for t, out in zip(terms, found) if t]
        result.update({
            f"terms_present_{name}": round(sum(t in words(out) for t, out in asked) / max(len(asked), 1), 4),
            f"bleu_{name}": round(sacrebleu.corpus_bleu(found, [references]).score, 2),
            f"seconds_{name}": round(seconds[name], 2),
            f"time_ratio_{name}": round(seconds[name] / seconds["plain"], 3),
            f"unchanged_{name}": sum(found[n] == plain[n] for n in held)})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
