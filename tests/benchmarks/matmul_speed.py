"""This machine's float32 matrix-product ceiling: `python tests/benchmarks/matmul_speed.py`.

Times torch's matmul (MKL on x86 CPUs) at shapes of a `small` training step at 4,096 tokens (a
feed-forward layer's forward product and its weight gradient, the vocabulary projection) and a
2,048 cube, three ways, alternating `--rounds` times: one process of 1 thread, one process of
`--threads` threads, and `--threads` processes of 1 thread each at the same time (the slowest of
them). One JSON line per shape, medians in GFLOP/s (2 m k n per product). The ratio of the second
to the first is what threads can give; the third shows whether processes running at once slow each
other down (shared cores or memory). No model code is involved: this is the bound that training
and decoding on this CPU work against.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import time
from typing import Any

import torch

# (m, k, n): x W^T of the feed-forward layer, its weight gradient, the vocabulary projection, a cube
SHAPES = [(4096, 256, 1024), (1024, 4096, 256), (4096, 256, 7960), (2048, 2048, 2048)]


def gflops(shape: tuple[int, int, int], threads: int, seconds: float) -> float:
    torch.set_num_threads(threads)
    m, k, n = shape
    a, b = torch.randn(m, k), torch.randn(k, n)
    out = a @ b
    for _ in range(2):
        torch.mm(a, b, out=out)
    runs, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        torch.mm(a, b, out=out)
        runs += 1
    return round(2 * m * k * n * runs / elapsed / 1e9, 1)


_barrier = None


def _init(barrier: Any) -> None:
    global _barrier
    _barrier = barrier


def _one_thread(shape: tuple[int, int, int], seconds: float) -> float:
    """In a worker: wait for the others (so that all time together), then time one thread."""
    _barrier.wait()
    return gflops(shape, 1, seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=1.0, help="per timing")
    parser.add_argument("--rounds", type=int, default=3, help="the three ways alternate; medians are printed")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every dimension (a quick check)")
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    shapes = [tuple(max(1, int(d * args.scale)) for d in shape) for shape in SHAPES]
    with context.Pool(args.threads, _init, (context.Barrier(args.threads),)) as pool:
        gflops(shapes[0], args.threads, args.seconds)  # warm-up: the first products of a process run slower
        for shape in shapes:
            one, many, apart = [], [], []
            for _ in range(args.rounds):
                one.append(gflops(shape, 1, args.seconds))
                many.append(gflops(shape, args.threads, args.seconds))
                apart.append(min(pool.starmap(_one_thread, [(shape, args.seconds)] * args.threads)))
            print(json.dumps({
                "benchmark": "matmul_speed", "shape_mkn": shape, "rounds": args.rounds,
                "gflops_1_thread": statistics.median(one), f"gflops_{args.threads}_threads": statistics.median(many),
                "threads_speedup": round(statistics.median(many) / statistics.median(one), 2),
                f"gflops_slowest_of_{args.threads}_processes_at_once": statistics.median(apart),
            }), flush=True)


if __name__ == "__main__":
    main()
