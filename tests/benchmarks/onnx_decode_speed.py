"""onnxruntime side by side: `python tests/benchmarks/onnx_decode_speed.py -m CKPT [--int8]`.

Exports the checkpoint as `nmt export --format onnx [--quantize int8]` does (timed, with the
folder's size and that of the two graphs transformers.js loads), then translates the input
(Multi30k test_2016_flickr.en) greedily in two ways, on the CPU with `--threads`:
  - nmt's own search (beam 1, float32, or int8 with `--int8` as `nmt translate --quantize int8`);
  - onnxruntime over the exported graphs (the int8 copies with `--int8`), as a caller writes it:
    the encoder, the first step, then each step from the last's cached keys and values, in batches
    of `--batch` sentences of similar length, with nmt's tokenizer in Python and nmt's length limit.
Prints one JSON line per engine in decode_speed.py's terms (sentences/s, target tokens/s, BLEU),
and for onnxruntime how many lines equal nmt's. Run it on an idle machine.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from common import OurSide, decoding_arguments, timed

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/builders.py's OnnxGraphs
from builders import OnnxGraphs  # noqa: E402

from nmt_cli.decode.controls import banned_ids
from nmt_cli.decode.engine import Engine
from nmt_cli.decode.search import max_lengths
from nmt_cli.interop.export_onnx import save_onnx
from nmt_cli.run_config import RunConfig
from nmt_cli.text.vocab import EOS_ID, PAD_ID


def padded(sources: list[list[int]], eos: bool) -> np.ndarray:
    """A batch of sources as the encoder takes them: </s> after each where the model's end with it."""
    src = np.full((len(sources), max(map(len, sources)) + eos), PAD_ID, np.int64)
    for row, ids in zip(src, sources):
        row[:len(ids) + eos] = ids + [EOS_ID] * eos
    return src


def main() -> None:
    parser = decoding_arguments(__doc__)
    parser.set_defaults(beam=1)
    parser.add_argument("--int8", action="store_true", help="the int8 graphs, and nmt's --quantize int8")
    parser.add_argument("--batch", type=int, default=32, help="sentences per onnxruntime batch")
    args = parser.parse_args()
    ours = OurSide.load(args)
    search, config = ours.engine.config.search, ours.bundle.model.config
    with tempfile.TemporaryDirectory() as work:
        folder, suffix = Path(work) / "onnx", "_quantized" if args.int8 else ""
        start = time.perf_counter()
        save_onnx(ours.bundle, folder, "int8" if args.int8 else "float32")  # before nmt's int8 changes the model
        exported = {"export_seconds": round(time.perf_counter() - start, 1),
                    "folder_mb": round(sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6, 1),
                    "transformers_js_loads_mb": round(sum((folder / "onnx" / f"{name}{suffix}.onnx").stat().st_size
                                                          for name in ("encoder_model", "decoder_model_merged")) / 1e6,
                                                      1)}
        graphs = OnnxGraphs(folder, suffix, args.threads)
    if args.int8:
        options = RunConfig(search, max_tokens=args.max_tokens, quantize="int8")
        ours = dataclasses.replace(ours, engine=Engine([ours.bundle], options, torch.device("cpu")))
    seconds, _, hyps = timed(ours.engine, ours.sources)
    mine = [ours.engine.pipeline.text(h[0].tokens) for h in hyps]
    common = {"model": str(args.model), "sentences": len(ours.lines), "beam": 1, "threads": args.threads,
              "int8": args.int8}
    print(json.dumps({"benchmark": "onnx_decode_speed", "engine": "nmt-cli", **common,
                      **ours.figures(seconds, sum(len(h[0].tokens) + 1 for h in hyps), mine)}))
    limits = max_lengths(torch.tensor([len(s) for s in ours.sources]), search, config.max_positions).tolist()
    banned = banned_ids(search, ours.bundle.never)
    order = sorted(range(len(ours.sources)), key=lambda k: len(ours.sources[k]))
    outputs: list[list[int]] = [[] for _ in ours.sources]
    start = time.perf_counter()
    for first in range(0, len(order), args.batch):
        batch = order[first:first + args.batch]
        found = graphs.greedy(padded([ours.sources[k] for k in batch], config.source_eos), [limits[k] for k in batch],
                              banned)
        for k, output in zip(batch, found):
            outputs[k] = output
    seconds = time.perf_counter() - start
    theirs = [ours.engine.pipeline.text(output) for output in outputs]
    print(json.dumps({"benchmark": "onnx_decode_speed", "engine": "onnxruntime", "onnxruntime": ort.__version__,
                      **common, **ours.figures(seconds, sum(len(output) + 1 for output in outputs), theirs),
                      "lines_equal_to_nmt": sum(a == b for a, b in zip(theirs, mine)), **exported}))


if __name__ == "__main__":
    main()
