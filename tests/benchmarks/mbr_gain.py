"""What MBR decoding buys and costs against beam search on the same model:
`python tests/benchmarks/mbr_gain.py -m AVG.pt -i test.en --ref test.de --mbr 8 16 --threads 2`.

Translates the input with beam search (`--beam`, `--lenpen`: the quickstart's 4 and 1.5), then with
`--mbr N` for each N, each `--utility` and each kind of `--candidates` (a beam of N, or N samples
at `--temperature`, seeded), in one process (the model loaded once), and prints one JSON line per
run: corpus BLEU and chrF (sacreBLEU, 13a) against `--ref`, and the seconds it took.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import sacrebleu
import torch

from nmt_cli import Translator


def scored(name: str, translator: Translator, lines: list[str], refs: list[str], **search: object) -> dict:
    start = time.perf_counter()
    hyps = translator.translate(lines, **search)
    seconds = time.perf_counter() - start
    return {"benchmark": "mbr_gain", "run": name, **search, "seconds": round(seconds, 2),
            "bleu": round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2),
            "chrf": round(sacrebleu.corpus_chrf(hyps, [refs]).score, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", type=Path, required=True)
    parser.add_argument("-i", "--input", type=Path, required=True)
    parser.add_argument("--ref", type=Path, required=True)
    parser.add_argument("--mbr", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--utility", nargs="+", default=["chrf", "bleu"], choices=["chrf", "bleu"])
    parser.add_argument("--candidates", nargs="+", default=["beam"], choices=["beam", "sample"])
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--lenpen", type=float, default=1.5)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--lines", type=int, default=None, help="the first N lines only")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lines = args.input.read_text(encoding="utf-8").splitlines()[:args.lines]
    refs = args.ref.read_text(encoding="utf-8").splitlines()[:len(lines)]
    translator = Translator.load(args.model, device="cpu", lenpen=args.lenpen)
    print(json.dumps(scored("beam", translator, lines, refs, beam=args.beam)), flush=True)
    for n, utility, candidates in itertools.product(args.mbr, args.utility, args.candidates):
        sampling = {"temperature": args.temperature, "seed": 1} if candidates == "sample" else {}
        print(json.dumps(scored("mbr", translator, lines, refs, mbr=n, mbr_utility=utility,
                                mbr_candidates=candidates, **sampling)), flush=True)


if __name__ == "__main__":
    main()
