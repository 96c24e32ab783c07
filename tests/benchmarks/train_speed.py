"""Training throughput: `python tests/benchmarks/train_speed.py DATA_DIR [--arch small] [--updates 30]`.

Builds the model on a data directory made by `nmt preprocess` (e.g. Multi30k en-de, 8,000 BPE
merges), runs `--warmup` updates, then times `--updates` updates of `--max-tokens` per update, and
prints one JSON line: target tokens/s (non-pad target tokens, as fairseq's `wps`), updates/s,
tokens per update, peak RSS, and the CPU time per second of the timed updates (`cpu_per_wall_s`:
how many cores were busy on average; run with OMP_WAIT_POLICY=PASSIVE so that threads waiting for
work sleep instead of spinning, else it reads about `--threads`). CPU threads: `--threads`
(default 2).

`--dropout-ab` times each of the `--updates` batches once per dropout kind, in turn (ours,
torch's F.dropout, none), and prints target tokens/s per kind: what dropout costs in a step.
`--freeze PART` (repeatable, as `nmt train --freeze`) times updates that leave those parts as they
are: what adapting a large model on a CPU costs an update (docs/train.md).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import resource
import tempfile
import time
import types
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from nmt_cli.config import TrainConfig
from nmt_cli.corpus.data import shuffled
from nmt_cli.model import kernels
from nmt_cli.model.architecture import PRESETS
from nmt_cli.train.run import TrainingRun


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--arch", default="small")
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--updates", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--fused-attention", action="store_true",
                        help="always the fused SDPA kernel (on the CPU, short sequences are written out)")
    parser.add_argument("--dropout-ab", action="store_true", help="each batch once per dropout kind, in turn")
    parser.add_argument("--freeze", action="append", default=[], help="a part to leave as it is (repeatable)")
    args = parser.parse_args()
    if args.fused_attention:
        kernels.WRITTEN_OUT_MAX_KEYS = 0
    config = TrainConfig(max_tokens=args.max_tokens, threads=args.threads, device=args.device,
                         precision=args.precision, compile=args.compile, lr_schedule="inverse-sqrt", lr=1e-3,
                         freeze=tuple(args.freeze))
    with tempfile.TemporaryDirectory() as save_dir:
        run = TrainingRun(args.data_dir, Path(save_dir), PRESETS[args.arch], config, progress_bar=False)
    batches = shuffled(run.batches, 1, 1)
    steps = args.warmup + args.updates
    batches = (batches * (steps // len(batches) + 1))[:steps]
    if args.dropout_ab:
        print(json.dumps({"benchmark": "train_speed_dropout", "arch": args.arch, "updates": args.updates,
                          "threads": torch.get_num_threads(), **dropout_ab(run, batches, args.warmup)}))
        return
    sync = torch.cuda.synchronize if run.runtime.device.type == "cuda" else (lambda: None)
    tokens = 0
    for step, indices in enumerate(batches, start=1):
        if step == args.warmup + 1:
            sync()
            start, cpu_start, tokens = time.perf_counter(), time.process_time(), 0
        tokens += update(run, indices, step)
    sync()
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    params = sum(p.numel() for p in run.model.parameters())
    print(json.dumps({
        "benchmark": "train_speed", "arch": args.arch, "parameters": params, "device": str(run.runtime.device),
        "dtype": str(run.runtime.dtype), "threads": torch.get_num_threads(), "max_tokens": args.max_tokens,
        "updates": args.updates, "target_tokens_per_s": round(tokens / seconds, 1),
        "updates_per_s": round(args.updates / seconds, 3), "seconds_per_update": round(seconds / args.updates, 3),
        "target_tokens_per_update": round(tokens / args.updates), "freeze": args.freeze,
        "cpu_per_wall_s": round(cpu_seconds / seconds, 2), "fused_attention": args.fused_attention,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
    }))


def update(run: TrainingRun, indices: np.ndarray, step: int) -> int:
    """One update on one batch; its target tokens (0 if the update was skipped)."""
    batch = run.train.collate(indices, run.pad_multiple)
    loss, _, tokens = run.trainer.update([batch], int(run.train.tgt_lengths[indices].sum()), step).tolist()
    return int(tokens) if math.isfinite(loss) else 0


def dropout_ab(run: TrainingRun, batches: list, warmup: int) -> dict[str, float]:
    """Target tokens/s per dropout kind, each timed batch run once per kind, the order rotating."""
    kinds = {"ours": kernels.Dropout.forward, "torch": lambda self, x: F.dropout(x, self.p, self.training),
             "none": lambda self, x: x}
    modules = [m for m in run.model.modules() if isinstance(m, kernels.Dropout) and m.p > 0]
    seconds, tokens = dict.fromkeys(kinds, 0.0), dict.fromkeys(kinds, 0)
    step = 0
    for i, indices in enumerate(batches):
        turn = i % len(kinds)
        names = list(kinds)[turn:] + list(kinds)[:turn] if i >= warmup else ["ours"]
        for name in names:
            for m in modules:
                m.forward = types.MethodType(kinds[name], m)
            step += 1
            start = time.perf_counter()
            update_tokens = update(run, indices, step)
            if i >= warmup:
                seconds[name] += time.perf_counter() - start
                tokens[name] += update_tokens
    speed = {name: tokens[name] / seconds[name] for name in kinds}
    return {f"target_tokens_per_s_{name}": round(v, 1) for name, v in speed.items()} | {
        "dropout_share_ours": round(1 - speed["ours"] / speed["none"], 4),
        "dropout_share_torch": round(1 - speed["torch"] / speed["none"], 4)}


if __name__ == "__main__":
    main()
