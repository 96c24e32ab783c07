"""The host's work per training update, with no arithmetic timed:
`python tests/benchmarks/host_overhead.py --arch base big`.

The model, its batches and fused Adam live on PyTorch's meta device, where every operator is
dispatched as on a GPU (nmt train's path off the CPU: every position projected, torch's dropout,
fused Adam; attention through the kernels CUDA's SDPA picks, `cuda_like_attention`) but only
shapes are computed. One JSON line per preset:
  - operators_per_update: ATen operator calls of one update (forward, loss, backward, clipping
    when set, optimizer), counted by a TorchDispatchMode; top_operators, the ten most called;
  - host_ms_per_update: the median wall time of an update there. Meta's shape functions are
    partly Python (torch._refs), so this overstates what CUDA's dispatcher spends per operator:
    a figure to compare between versions of the code, not a GPU time;
  - an update never reads a value back (a read of a meta tensor fails), so nothing here waits.
Autocast has no meta device: the figures are an fp32 update's (bf16 on a GPU adds a cast per
weight and forward). Batches: WMT14-like lengths at --max-tokens, padded to multiples of 8.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from common import wmt_like_pairs
from torch.utils._python_dispatch import TorchDispatchMode

from nmt_cli.architecture import PRESETS
from nmt_cli.config import TrainConfig
from nmt_cli.data import token_batches
from nmt_cli.model import Transformer
from nmt_cli.trainer import Runtime, Trainer
from nmt_cli.vocab import PAD_ID

META = torch.device("meta")


class CountOperators(TorchDispatchMode):
    """Counts the ATen operators dispatched inside it, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.calls[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


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


def measure(arch: str, vocab: int, max_tokens: int, updates: int, clip_norm: float) -> dict:
    sys.modules["torch.optim.adam"]._device_dtype_check_for_fused = lambda *args, **kwargs: None  # meta: shapes only
    torch.nn.functional.scaled_dot_product_attention = cuda_like_attention
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
    with CountOperators() as counted:
        trainer.update([collated[1]], tokens[1], updates + 2)
    return {"benchmark": "host_overhead", "arch": arch, "vocab": vocab, "max_tokens": max_tokens,
            "clip_norm": clip_norm, "updates": updates,
            "host_ms_per_update": round(1000 * statistics.median(seconds), 1),
            "operators_per_update": sum(counted.calls.values()), "top_operators": dict(counted.calls.most_common(10)),
            "torch": torch.__version__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", nargs="+", default=["base", "big"], choices=sorted(PRESETS))
    parser.add_argument("--vocab", type=int, default=37000)
    parser.add_argument("--max-tokens", type=int, default=25000)
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--clip-norm", type=float, default=0.0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for arch in args.arch:
        print(json.dumps(measure(arch, -(-args.vocab // 8) * 8, args.max_tokens, args.updates, args.clip_norm)),
              flush=True)


if __name__ == "__main__":
    main()
