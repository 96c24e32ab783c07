"""GPU training throughput and MFU: `python tests/benchmarks/gpu_speed.py --arch big [--compile]`.

Trains `--arch` (base, big) on synthetic sentence pairs of realistic lengths (source ~ WMT14
en-de: mean 27 tokens, sd 12, clipped to 4-128; target = source x U(0.8, 1.25)), so no data has to
travel, with the trainer nmt train uses (bf16 autocast by default, fused Adam, batches padded to
multiples of 8, SDPA attention), and prints one JSON line: target tokens/s and two MFU figures over
`--peak-tflops` (default: the dense bf16 peak of an H100/H200 SXM, 989 TFLOP/s):
  mfu_6nd: 6 x parameters x target tokens/s (the usual decoder-only formula);
  mfu_matmul: 6 x (encoder parameters x source tokens + (decoder parameters + V x d) x target
  tokens)/s, the matmul FLOPs an encoder-decoder really does (attention scores not counted).
On a GPU it also counts the calls that made the host wait for the device in the timed updates
(torch.cuda.set_sync_debug_mode): host_waits_per_update, 1 by design (the update's loss sums,
read to skip a non-finite update and to log). Runs on CPU too (`--device cpu`, small settings)
to check the code path.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from nmt_cli.config import PRESETS, TrainConfig
from nmt_cli.data import ArrayWriter, IndexedArray, ParallelData, token_batches
from nmt_cli.model import Transformer
from nmt_cli.train import Trainer, set_up_runtime
from nmt_cli.vocab import PAD_ID


def synthetic_pairs(directory: Path, pairs: int, vocab: int, seed: int = 0) -> ParallelData:
    rng = np.random.default_rng(seed)
    src_len = np.clip(rng.normal(27, 12, pairs), 4, 128).astype(int)
    tgt_len = np.clip(src_len * rng.uniform(0.8, 1.25, pairs), 4, 128).astype(int)
    arrays = []
    for name, lengths in (("src", src_len), ("tgt", tgt_len)):
        writer = ArrayWriter(directory / name, np.dtype(np.int32))
        writer.extend(rng.integers(4, vocab, int(lengths.sum())), lengths)
        writer.close()
        arrays.append(IndexedArray(directory / name, np.dtype(np.int32)))
    return ParallelData(*arrays)


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
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    args = parser.parse_args()
    config = TrainConfig(max_tokens=args.max_tokens, device=args.device, precision=args.precision,
                         compile=args.compile, lr_schedule="inverse-sqrt", lr=5e-4)
    runtime = set_up_runtime(config)
    vocab = -(-args.vocab // 8) * 8
    model = Transformer(PRESETS[args.arch], vocab, vocab, PAD_ID, True).to(runtime.device)
    trainer = Trainer(model, config, runtime)
    pad_multiple = 8 if runtime.device.type == "cuda" else 1
    with tempfile.TemporaryDirectory() as work:
        data = synthetic_pairs(Path(work), 200_000, vocab)
        batches = token_batches(data.src_lengths, data.tgt_lengths, args.max_tokens, pad_to_multiple=pad_multiple)
        order = np.random.default_rng(1).permutation(len(batches))[: args.warmup + args.updates]
        cuda = runtime.device.type == "cuda"
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        src_tokens = tgt_tokens = 0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step, b in enumerate(order, start=1):
                if step == args.warmup + 1:
                    sync()
                    start, src_tokens, tgt_tokens = time.perf_counter(), 0, 0
                    if cuda:  # from here on, every call that makes the host wait for the GPU warns
                        torch.cuda.set_sync_debug_mode("warn")
                indices = batches[b]
                trainer.update(data, [indices], int(data.tgt_lengths[indices].sum()), step, pad_multiple)
                src_tokens += int(data.src_lengths[indices].sum())
                tgt_tokens += int(data.tgt_lengths[indices].sum())
            if cuda:
                torch.cuda.set_sync_debug_mode("default")
            sync()
            seconds = time.perf_counter() - start
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    params = sum(p.numel() for p in model.parameters())
    encoder = sum(p.numel() for p in model.encoder_layers.parameters())
    decoder = sum(p.numel() for p in model.decoder_layers.parameters())
    peak = args.peak_tflops * 1e12
    matmul_flops = 6 * (encoder * src_tokens + (decoder + vocab * model.config.d_model) * tgt_tokens)
    print(json.dumps({
        "benchmark": "gpu_speed", "arch": args.arch, "parameters": params, "device": str(runtime.device),
        "device_name": torch.cuda.get_device_name() if cuda else "cpu",
        "dtype": str(runtime.dtype), "compile": args.compile, "max_tokens": args.max_tokens, "updates": args.updates,
        "target_tokens_per_s": round(tgt_tokens / seconds, 1), "updates_per_s": round(args.updates / seconds, 3),
        "mfu_6nd": round(6 * params * tgt_tokens / seconds / peak, 4),
        "mfu_matmul": round(matmul_flops / seconds / peak, 4), "peak_tflops": args.peak_tflops,
        "host_waits_per_update": round(syncs / args.updates, 2) if cuda else None,
        "peak_memory_gb": round(torch.cuda.max_memory_allocated() / 2**30, 1) if cuda else None,
    }))


if __name__ == "__main__":
    main()
