"""The fixed-shape decoder of `nmt translate --cuda-graphs` against the search on growing caches:
`python tests/benchmarks/graph_check.py -m CKPT [-i test.en] [--lines N] [--device cuda] [--replayed]`.

Translates the input (default: Multi30k test_2016_flickr.en) with the library's Engine, with
and without `graphs.DecoderGraphs`, and prints one JSON line: how many output lines are the same,
the sacreBLEU and seconds of each, and the operations per search step that launch work (aten
operations other than views) inside the decoder step and outside it, counted without graphs: what
a graph of the decoder step turns into one launch. On the CPU the fixed-shape decoder runs eagerly,
or with `--replayed` through tests/conftest.py's emulation of a CUDA graph; on a GPU it is
replayed as CUDA graphs (after an untimed warm-up on the first 64 lines, which captures them).
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

import sacrebleu
from common import decoding_arguments, timed
from torch.utils._python_dispatch import TorchDispatchMode

from nmt_cli.config import PRECISIONS, SearchConfig
from nmt_cli.decode import ensemble, graphs, search
from nmt_cli.decode import incremental as decoding
from nmt_cli.decode.engine import Engine
from nmt_cli.device import select, tune
from nmt_cli.model.checkpoint import load_bundle
from nmt_cli.run_config import RunConfig

VIEWS = {"view", "_unsafe_view", "reshape", "select", "slice", "unsqueeze", "squeeze", "expand", "expand_as", "alias",
         "t", "transpose", "permute", "split", "split_with_sizes", "unflatten", "flatten", "as_strided", "detach",
         "resolve_conj", "resolve_neg", "lift_fresh"}


class Operations(TorchDispatchMode):
    """Counts the aten operations that are not views, in the decoder step and outside it."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()
        self.where: str | None = None  # None: not counting

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.where is not None and func.__name__.split(".")[0] not in VIEWS:
            self.counts[self.where] += 1
        return func(*args, **(kwargs or {}))


def operations_per_step(engine: Engine, sources: list[list[int]]) -> dict[str, float]:
    """Operations per step of the search (from its first step to its results), decoder and rest."""
    steps, mode = [0], Operations()
    step_output, hypotheses = decoding.step_output, search.Finished.hypotheses

    def counted_step(model, tokens, state):
        steps[0] += 1
        mode.where = "decoder"
        try:
            return step_output(model, tokens, state)
        finally:
            mode.where = "rest"

    def results(self, nbest):
        mode.where = None
        return hypotheses(self, nbest)

    decoding.step_output, search.Finished.hypotheses = counted_step, results
    try:
        with mode:
            engine.generator.search(sources, engine.config.search)
    finally:
        decoding.step_output, search.Finished.hypotheses = step_output, hypotheses
    return {where: round(count / steps[0], 1) for where, count in mode.counts.items()}


def translate(engine: Engine, sources: list[list[int]]) -> tuple[float, list[str]]:
    seconds, _, hyps = timed(engine, sources)
    return seconds, [engine.pipeline.text(h[0].tokens) if h else "" for h in hyps]


def main() -> None:
    parser = decoding_arguments(__doc__)
    parser.add_argument("--lines", type=int, help="the first N lines only")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS)
    parser.add_argument("--replayed", action="store_true", help="CPU: replay through tests/conftest.py's emulation")
    args = parser.parse_args()
    if args.replayed:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from conftest import replayed

        graphs.capture = replayed
    device, dtype = select(args.device, args.precision)
    tune(device, args.threads)
    lines = args.input.read_text(encoding="utf-8").splitlines()[: args.lines]
    options = RunConfig(SearchConfig(beam=args.beam, lenpen=args.lenpen), max_tokens=args.max_tokens)
    engine = Engine([load_bundle(args.model)], options, device, dtype)
    sources = [engine.pipeline.source_ids(line, i + 1) for i, line in enumerate(lines)]
    growing = engine.generator.models
    seconds, outputs = translate(engine, sources)
    operations = operations_per_step(engine, sources)
    engine.generator.models = ensemble.Ensemble(growing.models, graphs=True)
    graph_seconds, graph_outputs = translate(engine, sources)
    result = {"benchmark": "graph_check", "model": str(args.model), "sentences": len(lines), "device": str(device),
              "dtype": str(dtype).removeprefix("torch."), "replayed": args.replayed,
              "same_lines": sum(a == b for a, b in zip(outputs, graph_outputs)),
              "seconds": round(seconds, 2), "graph_seconds": round(graph_seconds, 2),
              "operations_per_step": operations,
              "decoders": [list(shape) for shape in engine.generator.models.graphs[0].decoders]}
    if args.ref:
        refs = args.ref.read_text(encoding="utf-8").splitlines()[: args.lines]
        result["bleu"] = round(sacrebleu.corpus_bleu(outputs, [refs]).score, 2)
        result["graph_bleu"] = round(sacrebleu.corpus_bleu(graph_outputs, [refs]).score, 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
