"""GPU training throughput and MFU: `python tests/benchmarks/gpu_speed.py --arch big [--compile] [--baseline]`.

Trains `--arch` (base, big) on synthetic sentence pairs of realistic lengths (source ~ WMT14
en-de: mean 27 tokens, sd 12, clipped to 4-128; target = source x U(0.8, 1.25)), so no data has to
travel, with the trainer nmt train uses (bf16 autocast by default, fused Adam, batches padded to
multiples of 8 and collated ahead on a thread, SDPA attention), and prints one JSON line: target
tokens/s and two MFU figures over `--peak-tflops` (default: the dense bf16 peak of an H100/H200
SXM, 989 TFLOP/s):
  mfu_6nd: 6 x parameters x target tokens/s (the usual decoder-only formula);
  mfu_matmul: 6 x (encoder parameters x source tokens + (decoder parameters + V x d) x target
  tokens)/s, the matmul FLOPs an encoder-decoder really does (attention scores not counted).
On a GPU it also counts the calls that made the host wait for the device in the timed updates
(torch.cuda.set_sync_debug_mode): host_waits_per_update, 1 / device.steps_between_reads by design
(the updates' loss sums, read as `nmt train` reads them: every few updates, to log and to count
the updates skipped on the device for a non-finite loss).

`--length-buckets N` pads the batches as `nmt train --length-buckets N` does; every line says the
epoch's batch shapes and padding share.

`--baseline` also trains a plain `torch.nn.Transformer` of the same size (shared embeddings,
sinusoidal positions, label-smoothed `F.cross_entropy`, fused Adam, the same autocast) on the same
batches, already collated, in the same process, and prints its line and the ratio; with
`--compile` both are compiled. Runs on CPU too (`--device cpu`, small settings) to check the path.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from common import HostWaits, wmt_like_pairs

from nmt_cli.config import TrainConfig
from nmt_cli.corpus.data import (
    ParallelData,
    Prefetcher,
    length_buckets,
    padded_length,
    shapes_and_padding,
    token_batches,
)
from nmt_cli.device import steps_between_reads
from nmt_cli.model.architecture import PRESETS, ModelConfig
from nmt_cli.model.transformer import Transformer, positional_encoding
from nmt_cli.text.vocab import PAD_ID
from nmt_cli.train.runtime import Runtime, set_up_runtime
from nmt_cli.train.trainer import Trainer


class PlainTransformer(torch.nn.Module):
    """`torch.nn.Transformer` with the paper's embeddings: the baseline a user could write."""

    def __init__(self, config: ModelConfig, vocab: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, config.d_model, padding_idx=PAD_ID)
        self.scale = math.sqrt(config.d_model)
        self.register_buffer("positions", positional_encoding(config.max_positions, config.d_model), persistent=False)
        self.net = torch.nn.Transformer(config.d_model, config.heads, config.encoder_layers, config.decoder_layers,
                                        config.d_ff, config.dropout, batch_first=True)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        def embed(tokens: torch.Tensor) -> torch.Tensor:
            return self.embed(tokens) * self.scale + self.positions[: tokens.size(1)]

        causal = torch.nn.Transformer.generate_square_subsequent_mask(tgt_in.size(1), device=tgt_in.device)
        x = self.net(embed(src), embed(tgt_in), tgt_mask=causal, src_key_padding_mask=src == PAD_ID,
                     memory_key_padding_mask=src == PAD_ID, tgt_is_causal=True)
        return F.linear(x, self.embed.weight)


def time_updates(update: Callable[[int], None], steps: int, warmup: int, cuda: bool) -> tuple[float, int]:
    """Seconds for updates warmup..steps-1 (after `warmup` untimed ones), and the host waits counted."""
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for step in range(warmup):
        update(step)
    sync()
    start = time.perf_counter()
    with HostWaits.counting(cuda) as waits:
        for step in range(warmup, steps):
            update(step)
    sync()
    return time.perf_counter() - start, waits.count


def profile(update: Callable[[int], None], steps: int, path: Path) -> None:
    """torch.profiler over the last five updates again: the operator table, by device time, to `path`."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profiler(activities=activities) as prof:
        for step in range(steps - 5, steps):
            update(step)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    sort = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
    path.write_text(prof.key_averages().table(sort_by=sort, row_limit=40, max_name_column_width=60) + "\n"
                    + prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=60))


def ours(args: argparse.Namespace, runtime: Runtime, config: TrainConfig, data: ParallelData,
         batches: list[np.ndarray], vocab: int, buckets: np.ndarray | None, warmup: int) -> dict:
    model = Transformer(PRESETS[args.arch], vocab, vocab, PAD_ID, True).to(runtime.device)
    trainer = Trainer(model, config, runtime)
    prefetcher = Prefetcher(data, 8 if runtime.device.type == "cuda" else 1, background=runtime.device.type == "cuda",
                            buckets=buckets)

    read_every, pending = steps_between_reads(runtime.device), []

    def update(step: int) -> None:
        if step + 1 < len(batches):
            prefetcher.prefetch([batches[step + 1]])
        pending.append(trainer.update(prefetcher.get([batches[step]]), int(data.tgt_lengths[batches[step]].sum()),
                                      step + 1))
        if len(pending) == read_every:  # as nmt train reads the losses
            torch.stack(pending).tolist()
            pending.clear()

    seconds, waits = time_updates(update, len(batches), warmup, runtime.device.type == "cuda")
    if args.profile is not None:
        profile(update, len(batches), args.profile)
    prefetcher.close()
    encoder = sum(p.numel() for p in model.encoder_layers.parameters())
    decoder = sum(p.numel() for p in model.decoder_layers.parameters())
    return {"model": "nmt-cli", "parameters": sum(p.numel() for p in model.parameters()), "seconds": seconds,
            "host_waits": waits, "encoder": encoder, "decoder": decoder}


def baseline(args: argparse.Namespace, runtime: Runtime, config: TrainConfig, data: ParallelData,
             batches: list[np.ndarray], vocab: int, buckets: np.ndarray | None, warmup: int) -> dict:
    preset = PRESETS[args.arch]
    model = PlainTransformer(preset, vocab).to(runtime.device)
    net = torch.compile(model) if args.compile else model
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9,
                                 fused=runtime.device.type == "cuda")
    collated = [data.collate(b, 8 if runtime.device.type == "cuda" else 1, buckets) for b in batches]
    if runtime.device.type == "cuda":
        collated = [b.pin_memory() for b in collated]

    def update(step: int) -> None:
        batch = collated[step].to(runtime.device)
        with torch.autocast(runtime.device.type, dtype=runtime.dtype, enabled=runtime.dtype != torch.float32):
            logits = net(batch.src, batch.tgt_in)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), batch.tgt_out.flatten(), ignore_index=PAD_ID,
                               label_smoothing=preset.label_smoothing, reduction="sum")
        (loss / int(data.tgt_lengths[batches[step]].sum())).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    seconds, waits = time_updates(update, len(batches), warmup, runtime.device.type == "cuda")
    return {"model": "torch.nn.Transformer", "parameters": sum(p.numel() for p in model.parameters()),
            "seconds": seconds, "host_waits": waits}


def line_of(args: argparse.Namespace, runtime: Runtime, shape_count: int, padding: float, src_tokens: int,
            tgt_tokens: int, vocab: int) -> Callable[[dict], None]:
    """A printer of one run's JSON line: throughput, MFU, host waits and memory."""
    cuda = runtime.device.type == "cuda"
    peak = args.peak_tflops * 1e12
    d_model = PRESETS[args.arch].d_model

    def report(run: dict) -> None:
        seconds = run["seconds"]
        result = {"benchmark": "gpu_speed", "model": run["model"], "arch": args.arch, "parameters": run["parameters"],
                  "device": str(runtime.device), "device_name": torch.cuda.get_device_name() if cuda else "cpu",
                  "dtype": str(runtime.dtype), "compile": args.compile,
                  "compile_mode": args.compile_mode if run["model"] == "nmt-cli" and args.compile else None,
                  "max_tokens": args.max_tokens,
                  "length_buckets": args.length_buckets, "epoch_shapes": shape_count, "padding": round(padding, 3),
                  "updates": args.updates, "target_tokens_per_s": round(tgt_tokens / seconds, 1),
                  "updates_per_s": round(args.updates / seconds, 3),
                  "mfu_6nd": round(6 * run["parameters"] * tgt_tokens / seconds / peak, 4),
                  "peak_tflops": args.peak_tflops,
                  "host_waits_per_update": round(run["host_waits"] / args.updates, 2) if cuda else None,
                  "peak_memory_gb": round(torch.cuda.max_memory_allocated() / 2**30, 1) if cuda else None}
        if "encoder" in run:
            matmul = 6 * (run["encoder"] * src_tokens + (run["decoder"] + vocab * d_model) * tgt_tokens)
            result["mfu_matmul"] = round(matmul / seconds / peak, 4)
        print(json.dumps(result), flush=True)

    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--arch", default="big", choices=sorted(PRESETS))
    parser.add_argument("--vocab", type=int, default=37000)
    parser.add_argument("--max-tokens", type=int, default=25000)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--updates", type=int, default=40)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--compile-mode", default="default", help="as nmt train's (ours only; the baseline: default)")
    parser.add_argument("--length-buckets", type=int, default=0, help="as nmt train's; the untimed updates then "
                        "include one batch of every shape, so that no compilation is timed")
    parser.add_argument("--baseline", action="store_true", help="also time a plain torch.nn.Transformer")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--profile", type=Path, help="write a torch.profiler table of our trainer here")
    args = parser.parse_args()
    config = TrainConfig(max_tokens=args.max_tokens, device=args.device, precision=args.precision,
                         compile=args.compile, compile_mode=args.compile_mode, length_buckets=args.length_buckets,
                         lr_schedule="inverse-sqrt",
                         lr=5e-4)
    runtime = set_up_runtime(config)
    cuda = runtime.device.type == "cuda"
    vocab = -(-args.vocab // 8) * 8
    with tempfile.TemporaryDirectory() as work:
        data = wmt_like_pairs(Path(work), 200_000, vocab)
        multiple = 8 if cuda else 1
        buckets = length_buckets(data.src_lengths, data.tgt_lengths, args.length_buckets, multiple) \
            if args.length_buckets else None
        all_batches = token_batches(data.src_lengths, data.tgt_lengths, args.max_tokens, None, multiple, buckets)
        order = np.random.default_rng(1).permutation(len(all_batches))[: args.warmup + args.updates]
        batches = [all_batches[b] for b in order]
        if buckets is not None:  # one batch of each shape first, untimed
            shapes = {(len(b), int(padded_length(max(data.src_lengths[b].max(), data.tgt_lengths[b].max()), 1,
                                                 buckets))): b for b in all_batches}
            batches = [*shapes.values(), *batches]
        shape_count, padding = shapes_and_padding(data, all_batches, multiple, buckets)
        warmup = len(batches) - args.updates
        timed = batches[warmup:]
        src_tokens = int(sum(data.src_lengths[b].sum() for b in timed))
        tgt_tokens = int(sum(data.tgt_lengths[b].sum() for b in timed))
        report = line_of(args, runtime, shape_count, padding, src_tokens, tgt_tokens, vocab)
        runs = [ours(args, runtime, config, data, batches, vocab, buckets, warmup)]
        report(runs[0])  # printed at once: a compile run cut off at its time limit keeps ours
        if args.baseline:
            runs.append(baseline(args, runtime, config, data, batches, vocab, buckets, warmup))
            report(runs[1])
            print(json.dumps({"benchmark": "gpu_speed", "arch": args.arch, "compile": args.compile,
                              "speedup_over_torch_nn_transformer": round(runs[1]["seconds"] / runs[0]["seconds"], 3)}))


if __name__ == "__main__":
    main()
