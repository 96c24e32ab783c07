"""Attention on the CPU, fused kernel against written out: `python tests/benchmarks/attention_speed.py`.

Times `F.scaled_dot_product_attention` and the written-out q k^T / softmax / v of
`MultiHeadAttention.attend` with the fast paths (kernels.WrittenOutAttention, switched through
`kernels.WRITTEN_OUT_MAX_KEYS`),
the output projection W^O included, forward + backward and forward alone, at the shapes of a
4,096-token batch (4 heads of 64, a key padding mask, or causal), alternating `--rounds` times.
One JSON line per shape: the milliseconds of each and the speed-up of writing it out, per round.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import nmt_cli.model.transformer as model_module
from nmt_cli.device import tune
from nmt_cli.model import kernels
from nmt_cli.model.architecture import PRESETS


def timed(attention: model_module.MultiHeadAttention, batch: int, length: int, causal: bool, backward: bool,
          repeat: int) -> float:
    q, k, v = (torch.randn(batch, 4, length, 64, requires_grad=backward) for _ in range(3))
    mask = None if causal else torch.rand(batch, 1, 1, length) > 0.1
    if mask is not None:
        mask[..., 0] = True
    attention.train(backward)

    def once() -> None:
        out = attention.attend(q, k, v, mask, causal)
        if backward:
            out.sum().backward()

    with torch.set_grad_enabled(backward):
        once()
        start = time.perf_counter()
        for _ in range(repeat):
            once()
    return (time.perf_counter() - start) / repeat * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    tune(torch.device("cpu"), args.threads)
    torch.manual_seed(0)
    attention = kernels.use_fast_paths(model_module.MultiHeadAttention(PRESETS["small"], self_attention=True))
    for batch, length in ((400, 10), (200, 20), (120, 34), (64, 64), (32, 128), (16, 256)):
        for causal in (False, True):
            for backward in (True, False):
                rounds = []
                for _ in range(args.rounds):
                    ms = {}
                    for name, limit in (("fused", 0), ("written_out", 1 << 30)):
                        kernels.WRITTEN_OUT_MAX_KEYS = limit
                        ms[name] = timed(attention, batch, length, causal, backward, args.repeat)
                    rounds.append(ms)
                print(json.dumps({
                    "benchmark": "attention_speed", "batch": batch, "length": length, "heads": 4, "d_k": 64,
                    "mask": "causal" if causal else "padding", "backward": backward, "threads": args.threads,
                    "fused_ms": [round(r["fused"], 2) for r in rounds],
                    "written_out_ms": [round(r["written_out"], 2) for r in rounds],
                    "speedup": [round(r["fused"] / r["written_out"], 2) for r in rounds],
                }), flush=True)


if __name__ == "__main__":
    main()
