"""The host's work per training update and per search step, with no arithmetic timed:
`python tests/benchmarks/host_overhead.py --arch base big --search-arch small base`.

The model, its batches and fused Adam live on PyTorch's meta device, where every operator is
dispatched as on a GPU (nmt train's path off the CPU: every position projected, torch's dropout,
fused Adam, clipping's multi-tensor kernels; attention through the kernels CUDA's SDPA picks,
`cuda_like_attention`) but only shapes are computed. One JSON line per preset:
  - operators_per_update: ATen operator calls of one update (forward, loss, backward, clipping
    when set, optimizer), counted by a TorchDispatchMode; top_operators, the ten most called;
  - operators_outside_compiled: those of them outside the model's and the loss's forward and
    backward, which `--compile` turns into one graph launch each (and `--compile-mode
    reduce-overhead` into one CUDA graph replay each): what the host still dispatches one by one
    then (the optimizer, clipping, the loss sums); outside_by_name, all of them by name;
  - host_ms_per_update: the median wall time of an update there. Meta's shape functions are
    partly Python (torch._refs), so this overstates what CUDA's dispatcher spends per operator:
    a figure to compare between versions of the code, not a GPU time;
  - an update never reads a value back (a read of a meta tensor fails), so nothing here waits.
Autocast has no meta device: the figures are an fp32 update's (bf16 on a GPU adds a cast per
weight and forward). Batches: WMT14-like lengths at --max-tokens, padded to multiples of 8.

Search steps (`--search-arch`): beam search (nmt translate's, beam 4) of `--sentences` sentences of
`--source-length` tokens on meta, eager and with `--cuda-graphs`, whose decoder step is then
replayed at no host cost (a graph replay is one launch). The search's reads of the device
(which sentences are done, every 8 steps as on a GPU) are answered on the host: no sentence is
ever done, so every search runs to its length limit; the difference between a search of 56 and
one of 24 steps, divided by 32, is a step's (the encoder and the start cancel out):
operators_per_step, host_ms_per_step, reads_per_step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch
from common import wmt_like_pairs
from torch.utils._python_dispatch import TorchDispatchMode

from nmt_cli.config import SearchConfig, TrainConfig
from nmt_cli.corpus.data import Batch, token_batches
from nmt_cli.decode import graphs as nmt_graphs
from nmt_cli.decode.ensemble import Ensemble
from nmt_cli.decode.search import beam_search
from nmt_cli.model.architecture import PRESETS
from nmt_cli.model.kernels import use_fast_paths
from nmt_cli.model.transformer import Transformer
from nmt_cli.text.vocab import PAD_ID
from nmt_cli.train.runtime import Runtime
from nmt_cli.train.trainer import Trainer

META = torch.device("meta")


class CountOperators(TorchDispatchMode):
    """Counts the ATen operators dispatched inside it, by name: all of them, and those outside the
    regions `compiled` marks."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()
        self.outside: Counter[str] = Counter()
        self.depth = 0  # > 0 inside a compiled region

    @contextlib.contextmanager
    def compiled(self) -> Iterator[None]:
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.calls[str(func.overloadpacket)] += 1
        if not self.depth:
            self.outside[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def count_operators(trainer: Trainer, batch: Batch, tokens: int, step: int) -> CountOperators:
    """The operators of one update, those of the net's forward and of the backward marked compiled."""
    counted = CountOperators()
    forward, backward = trainer.net.forward, torch.autograd.backward

    def marked(function: Callable) -> Callable:
        return lambda *args, **kwargs: counted.compiled()(function)(*args, **kwargs)

    trainer.net.forward, torch.autograd.backward = marked(forward), marked(backward)
    try:
        with counted:
            trainer.update([batch], tokens, step)
    finally:
        trainer.net.forward, torch.autograd.backward = forward, backward
    return counted


class EmulatedReads:
    """Reads of meta tensors back to the host (tolist, cpu, item, bool) answered there, at no cost
    to the other operators: integers as `integer` (a search's length limit), flags as False (no
    sentence done), floats as 0; counted in `reads`."""

    METHODS = ("tolist", "cpu", "item", "__bool__")

    def __init__(self, integer: int) -> None:
        self.integer, self.reads = integer, 0
        self.real = {name: getattr(torch.Tensor, name) for name in self.METHODS}

    def value(self, dtype: torch.dtype) -> int | bool | float:
        return False if dtype == torch.bool else 0.0 if dtype.is_floating_point else self.integer

    def answered(self, name: str) -> Callable:
        def read(x: torch.Tensor, *args: object, **kwargs: object) -> object:
            if not x.is_meta:
                return self.real[name](x, *args, **kwargs)
            self.reads += 1
            on_host = torch.full(x.shape, self.value(x.dtype), dtype=x.dtype)
            return on_host if name == "cpu" else self.real[name](on_host)
        return read

    def __enter__(self) -> EmulatedReads:
        for name in self.METHODS:
            setattr(torch.Tensor, name, self.answered(name))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, method in self.real.items():
            setattr(torch.Tensor, name, method)


def free_replay(step: Callable[[], torch.Tensor], device: torch.device,
                pool: object = None) -> Callable[[], torch.Tensor]:
    """graphs.capture as the host sees a CUDA graph: the step runs once (the capture), and a replay
    costs nothing."""
    out = step()
    return lambda: out


def search(models: Ensemble, src: torch.Tensor, steps: int, repeats: int) -> tuple[float, Counter[str], int]:
    """The median seconds of `repeats` beam searches of `steps` steps on meta, and the operators and
    reads of one search, counted before them, untimed (a dispatch mode slows every operator),
    after a first search that takes the one-time costs (with graphs, a decoder of this length)."""
    config = SearchConfig(beam=4)
    with EmulatedReads(steps - 1) as reads:
        beam_search(models, src, config)
        first_reads = reads.reads
        with CountOperators() as counted:
            beam_search(models, src, config)
        read_count = reads.reads - first_reads
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            beam_search(models, src, config)
            seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), counted.calls, read_count


def measure_search(arch: str, vocab: int, sentences: int, source_length: int, graphs: bool, repeats: int) -> dict:
    """Operators, host ms and reads per step of a search: the difference between 56 and 24 steps."""
    model = use_fast_paths(Transformer(PRESETS[arch], vocab, vocab, PAD_ID, True).to(META).eval())
    src = torch.full((sentences, source_length), 5, device=META)
    real_capture = nmt_graphs.capture
    nmt_graphs.capture = free_replay
    try:
        models = Ensemble([model], graphs=graphs)
        (short_s, short_ops, short_reads), (long_s, long_ops, long_reads) = (
            search(models, src, steps, repeats) for steps in (24, 56))
    finally:
        nmt_graphs.capture = real_capture
    span = 56 - 24
    return {"benchmark": "host_overhead", "what": "search_step", "arch": arch, "vocab": vocab, "sentences": sentences,
            "beam": 4, "source_length": source_length, "cuda_graphs": graphs, "repeats": repeats,
            "host_ms_per_step": round(1000 * (long_s - short_s) / span, 2),
            "operators_per_step": round((long_ops.total() - short_ops.total()) / span, 1),
            "top_operators_per_step": {name: round(count / span, 2) for name, count in
                                       (long_ops - short_ops).most_common(10)},
            "reads_per_step": round((long_reads - short_reads) / span, 3), "torch": torch.__version__}


def cuda_like_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
                        dropout_p: float = 0.0, is_causal: bool = False) -> torch.Tensor:
    """F.scaled_dot_product_attention as CUDA runs it in training: flash attention without a mask,
    the memory-efficient kernel with the boolean mask made an additive bias (on meta, SDPA would
    otherwise take its math fallback, a dozen operators where a GPU launches one kernel)."""
    if attn_mask is None:
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal)[0]
    bias = torch.where(attn_mask, 0.0, float("-inf")).to(q.dtype)
    bias = bias.expand(q.size(0), q.size(1), q.size(2), k.size(2))
    return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, dropout_p, is_causal)[0]


def like_cuda() -> None:
    """Meta takes CUDA's paths: fused Adam, clipping's multi-tensor kernels (meta is not among
    their devices; their kernels run there all the same), and SDPA's kernels."""
    sys.modules["torch.optim.adam"]._device_dtype_check_for_fused = lambda *args, **kwargs: None
    foreach = torch.utils._foreach_utils
    supported = foreach._get_foreach_kernels_supported_devices
    foreach._get_foreach_kernels_supported_devices = lambda: [*supported(), "meta"]
    torch.nn.functional.scaled_dot_product_attention = cuda_like_attention


def measure(arch: str, vocab: int, max_tokens: int, updates: int, clip_norm: float) -> dict:
    model = Transformer(PRESETS[arch], vocab, vocab, PAD_ID, True).to(META)
    trainer = Trainer(model, TrainConfig(max_tokens=max_tokens, clip_norm=clip_norm), Runtime(META, torch.float32))
    assert trainer.skips_on_device
    with tempfile.TemporaryDirectory() as work:
        data = wmt_like_pairs(Path(work), 20_000, vocab)
        batches = token_batches(data.src_lengths, data.tgt_lengths, max_tokens, pad_to_multiple=8)
        chosen = [batches[i] for i in np.random.default_rng(0).permutation(len(batches))[:updates + 1]]
        collated = [data.collate(b, 8).to(META) for b in chosen]
        tokens = [int(data.tgt_lengths[b].sum()) for b in chosen]
    trainer.update([collated[0]], tokens[0], 1)  # first-use costs (optimizer state) untimed
    seconds = []
    for step, (batch, count) in enumerate(zip(collated[1:], tokens[1:]), start=2):
        start = time.perf_counter()
        trainer.update([batch], count, step)
        seconds.append(time.perf_counter() - start)
    counted = count_operators(trainer, collated[1], tokens[1], updates + 2)
    return {"benchmark": "host_overhead", "what": "update", "arch": arch, "vocab": vocab, "max_tokens": max_tokens,
            "clip_norm": clip_norm, "updates": updates,
            "host_ms_per_update": round(1000 * statistics.median(seconds), 1),
            "operators_per_update": sum(counted.calls.values()), "top_operators": dict(counted.calls.most_common(10)),
            "operators_outside_compiled": sum(counted.outside.values()),
            "outside_by_name": dict(counted.outside.most_common()),
            "torch": torch.__version__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", nargs="*", default=["base", "big"], choices=sorted(PRESETS))
    parser.add_argument("--vocab", type=int, default=37000)
    parser.add_argument("--max-tokens", type=int, default=25000)
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--clip-norm", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--search-arch", nargs="*", default=[], choices=sorted(PRESETS))
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--source-length", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    like_cuda()
    vocab = -(-args.vocab // 8) * 8
    for arch in args.arch:
        print(json.dumps(measure(arch, vocab, args.max_tokens, args.updates, args.clip_norm)), flush=True)
    for arch in args.search_arch:
        for graphs in (False, True):
            print(json.dumps(measure_search(arch, vocab, args.sentences, args.source_length, graphs, args.repeats)),
                  flush=True)


if __name__ == "__main__":
    main()
