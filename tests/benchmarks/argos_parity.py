"""Argos Translate side by side: `python tests/benchmarks/argos_parity.py -m CKPT --sentences
TRAIN.SRC --argos-python PY [-i SRC --ref REF] [--lines N]` (default: Multi30k's test_2016_flickr
en-de from the shared data; PY: the interpreter of a virtual environment with argos-translate-lt,
as tests/interop/test_argos.py caches it under ~/.cache/nmt-cli/argos-translate-lt-1.12.1).

Exports CKPT (a SentencePiece model) as Argos packages in float32 and int8 (`nmt export --format
argos`), installs each into argostranslate and translates the lines with it as LibreTranslate
does, then prints one JSON line per package: how many lines equal `nmt translate` of CKPT with
Argos's search (ARGOS_SEARCH) on the sentences MiniSBD splits them into, argostranslate's
seconds (its process: start, load, translate) and sacreBLEU; and one for nmt: CKPT's BLEU with
Argos's search, and that of the int8 package imported back (`nmt import`: its weights as q / scale,
run in float32).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sacrebleu
from common import SHARED

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "interop"))
from argos_client import joined, sentences, translate  # noqa: E402  (the tests' client of argostranslate)

from nmt_cli.decode.translator import Translator  # noqa: E402
from nmt_cli.interop.export_argos import ARGOS_SEARCH  # noqa: E402
from nmt_cli.model.checkpoint import load_bundle  # noqa: E402

MULTI30K = SHARED / "multi30k"


def nmt(*args: object) -> None:
    subprocess.run([sys.executable, "-m", "nmt_cli", *map(str, args)], check=True, capture_output=True)


def as_argos(model: Path, texts: list[str], where: Path, package: Path) -> list[str]:
    """`model`'s translations of `texts` sentence by sentence with Argos's search, joined as Argos."""
    split = sentences(package, texts, where)
    flat = [s for text in split for paragraph in text for s in paragraph]
    return joined(Translator.load(model, device="cpu", threads=2).translate(flat, **ARGOS_SEARCH), split)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--model", type=Path, required=True)
    parser.add_argument("--sentences", type=Path, required=True, help="source text for the sentence splitter")
    parser.add_argument("--argos-python", type=Path, required=True)
    parser.add_argument("-i", "--input", type=Path, default=MULTI30K / "test_2016_flickr.en")
    parser.add_argument("--ref", type=Path, default=MULTI30K / "test_2016_flickr.de")
    parser.add_argument("--pair", nargs=2, default=None, help="the package's codes [default: the model's]")
    parser.add_argument("--lines", type=int, default=None)
    args = parser.parse_args()
    lines = args.input.read_text(encoding="utf-8").splitlines()[:args.lines]
    refs = args.ref.read_text(encoding="utf-8").splitlines()[:len(lines)]
    text = load_bundle(args.model).text
    pair = tuple(args.pair or (text.source_lang, text.target_lang))
    with tempfile.TemporaryDirectory() as work:
        tmp = Path(work)
        ours: list[str] | None = None  # with the first package's sentence splitter (both have the same)
        for quantization in ("float32", "int8"):
            package = tmp / f"{quantization}.argosmodel"
            nmt("export", "-m", args.model, "--format", "argos", "-o", package, "--quantize", quantization,
                "--sentences", args.sentences)
            translate(args.argos_python, [package], [], tmp / quantization)  # installed, not timed
            start = time.perf_counter()
            theirs = translate(args.argos_python, [package], lines, tmp / quantization, pair)
            seconds = time.perf_counter() - start
            if ours is None:
                ours = as_argos(args.model, lines, tmp, package)
            print(json.dumps({"benchmark": "argos_parity", "package": quantization, "lines": len(lines),
                              "equal_to_nmt": sum(a == b for a, b in zip(theirs, ours)),
                              "argos_seconds": round(seconds, 1),  # its process: start, load, translate
                              "argos_bleu": round(sacrebleu.corpus_bleu(theirs, [refs]).score, 2)}), flush=True)
        nmt("import", tmp / "int8.argosmodel", "-o", tmp / "int8.pt")
        imported = as_argos(tmp / "int8.pt", lines, tmp, tmp / "int8.argosmodel")
        print(json.dumps({"benchmark": "argos_parity", "package": "nmt", "lines": len(lines),
                          "nmt_bleu": round(sacrebleu.corpus_bleu(ours, [refs]).score, 2),
                          "int8_imported_bleu": round(sacrebleu.corpus_bleu(imported, [refs]).score, 2)}), flush=True)


if __name__ == "__main__":
    main()
