"""Decoding speed: `python tests/benchmarks/decode_speed.py -m CKPT [-i test.en] [--beam 4] [--quantize int8]
[--shortlist FILE] [--batch-size N]
[--device cuda --precision bf16 --cuda-graphs --steps-between-reads N --profile FILE]`.

Translates the input (default: Multi30k test_2016_flickr.en, 1,000 sentences) with the library's
Engine, timing the translation only (model loading excluded), and prints one JSON line:
sentences/s, target tokens/s (BPE tokens + EOS, as fairseq counts), peak RSS; with `--ref`, the
sacreBLEU of the output too. On a GPU, the first 64 sentences are translated once untimed (CUDA
warm-up), and the line also gives the calls that made the host wait for the GPU
(torch.cuda.set_sync_debug_mode). `--profile FILE` translates again under torch.profiler, writes
its operator table to FILE and adds `device_busy`: the GPU's kernel time over the wall time of
that translation (the share of the search the GPU works). `--cuda-graphs` replays the decoder's
steps as CUDA graphs (`nmt translate --cuda-graphs`); the warm-up then also captures the graphs of
the first batch's shape. `--steps-between-reads N` overrides how often the search reads which
sentences are done (`device.steps_between_reads`), to choose that number by measurement.
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path

import torch
from common import decoding_arguments, timed

from nmt_cli.config import PRECISIONS, SearchConfig
from nmt_cli.decode import search
from nmt_cli.decode.engine import Engine
from nmt_cli.decode.shortlist import Shortlist
from nmt_cli.device import select, tune
from nmt_cli.model.checkpoint import load_bundle
from nmt_cli.run_config import RunConfig


def profiled(engine: Engine, sources: list[list[int]], path: Path) -> float | None:
    """Translate under torch.profiler, write its tables to `path` (by operator, then by operator and
    input shapes: which matmul a kernel serves); the GPU's busy share, if any."""
    from torch.profiler import ProfilerActivity, profile

    cuda = engine.device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []),
                 record_shapes=True) as prof:
        start = time.perf_counter()
        engine.generator.search(sources, engine.config.search)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    events = prof.key_averages()
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    path.write_text(events.table(sort_by=sort, row_limit=40, max_name_column_width=60) + "\n"
                    + prof.key_averages(group_by_input_shape=True).table(sort_by=sort, row_limit=25,
                                                                         max_name_column_width=40) + "\n")
    if not cuda:
        return None
    kernels = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    return round(kernels / 1e6 / seconds, 3)


def main() -> None:
    parser = decoding_arguments(__doc__)
    parser.set_defaults(ref=None)  # BLEU only when asked for
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS)
    parser.add_argument("--quantize", choices=["int8"], default=None)
    parser.add_argument("--cuda-graphs", action="store_true")
    parser.add_argument("--batch-size", type=int, help="at most this many sentences a batch (1: a server's latency)")
    parser.add_argument("--steps-between-reads", type=int)
    parser.add_argument("--profile", type=Path, help="write a torch.profiler table of a second translation here")
    args = parser.parse_args()
    if args.steps_between_reads:
        search.steps_between_reads = lambda device: args.steps_between_reads
    device, dtype = select(args.device, args.precision)
    tune(device, args.threads)  # threads and memory as `nmt translate`'s
    lines = args.input.read_text(encoding="utf-8").splitlines()
    options = RunConfig(SearchConfig(beam=args.beam, lenpen=args.lenpen), max_tokens=args.max_tokens,
                        batch_size=args.batch_size, quantize=args.quantize, cuda_graphs=args.cuda_graphs)
    bundle = load_bundle(args.model)
    engine = Engine([bundle], options, device, dtype,
                            shortlist=args.shortlist and Shortlist.load(args.shortlist, bundle))
    sources = [engine.pipeline.source_ids(line, i + 1) for i, line in enumerate(lines)]
    seconds, waits, hyps = timed(engine, sources)
    outputs = [engine.pipeline.text(h[0].tokens) if h else "" for h in hyps]
    tokens = sum(len(h[0].tokens) + 1 for h in hyps if h)
    result = {"benchmark": "decode_speed", "model": str(args.model), "sentences": len(lines), "beam": args.beam,
              "device": str(device), "dtype": str(dtype).removeprefix("torch."), "quantize": args.quantize,
              "shortlist": args.shortlist and str(args.shortlist),
              "cuda_graphs": args.cuda_graphs, "steps_between_reads": search.steps_between_reads(device),
              "threads": torch.get_num_threads(), "seconds": round(seconds, 2),
              "sentences_per_s": round(len(lines) / seconds, 1), "target_tokens_per_s": round(tokens / seconds, 1),
              "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}
    if device.type == "cuda":
        result["host_waits"] = waits
    if args.ref:
        import sacrebleu

        refs = args.ref.read_text(encoding="utf-8").splitlines()
        result["bleu"] = round(sacrebleu.corpus_bleu(outputs, [refs]).score, 2)
    if args.profile:
        result["device_busy"] = profiled(engine, sources, args.profile)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
