"""`nmt translate` end to end on a short file: `python tests/benchmarks/translate_startup.py -m CKPT
[-i test.en] [--lines 100] [--device cpu|cuda [--cuda-graphs]] [--rounds 3] [--arch big]`.

Each round runs `python -m nmt_cli translate` on the first `--lines` lines in a fresh process and
times it from the outside (interpreter start to exit). One more fresh process times the stages
one after another (`--stages`): importing torch, importing the rest of `nmt translate`'s code,
choosing the device (CUDA initialization), loading the checkpoint, building the engine,
translating. Prints one JSON line. With `--arch`, the checkpoint timed is an untrained model of
that preset with CKPT's vocabulary and text settings (what loading a large model costs).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def stages(model: Path, source: Path, device: str, cuda_graphs: bool) -> dict[str, float]:
    """Seconds of each stage of a translation, in this (fresh) process."""
    marks = [("start", time.perf_counter())]

    def mark(name: str) -> None:
        marks.append((name, time.perf_counter()))

    import torch  # noqa: F401

    mark("import_torch")
    from nmt_cli.decode.engine import Engine
    from nmt_cli.decode.translate import translate_lines
    from nmt_cli.device import select, tune
    from nmt_cli.model.checkpoint import load_bundle
    from nmt_cli.run_config import RunConfig

    mark("import_nmt_cli")
    config = RunConfig(device=device, cuda_graphs=cuda_graphs)
    torch_device, dtype = select(config.device, config.precision)
    tune(torch_device, config.threads)
    mark("select_device")
    bundle = load_bundle(model)
    mark("load_checkpoint")
    engine = Engine([bundle], config, torch_device, dtype)
    mark("build_translator")
    translate_lines(engine, source.read_text(encoding="utf-8").splitlines())
    mark("translate")
    return {name: round(t - marks[i][1], 3) for i, (name, t) in enumerate(marks[1:])}


def untrained(model: Path, arch: str, path: Path) -> Path:
    """A checkpoint of an untrained `arch` model with the vocabulary and text settings of `model`."""
    from nmt_cli.model import checkpoint
    from nmt_cli.model.architecture import PRESETS
    from nmt_cli.model.transformer import Transformer
    from nmt_cli.text.vocab import PAD_ID

    bundle = checkpoint.load_bundle(model)
    shared = bundle.src_vocab is bundle.tgt_vocab
    bundle.model = Transformer(PRESETS[arch], len(bundle.src_vocab), len(bundle.tgt_vocab), PAD_ID, shared)
    checkpoint.save(bundle.describe(), path)
    return path


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-m", "--model", type=Path, required=True)
    parser.add_argument("-i", "--input", type=Path, help="default: Multi30k test_2016_flickr.en")
    parser.add_argument("--lines", type=int, default=100)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cuda-graphs", action="store_true", help="nmt translate --cuda-graphs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--arch", help="time an untrained model of this preset instead (CKPT's vocabulary)")
    parser.add_argument("--stages", action="store_true", help=argparse.SUPPRESS)  # the breakdown's own process
    args = parser.parse_args()
    if args.stages:  # before anything else is imported
        print(json.dumps(stages(args.model, args.input, args.device, args.cuda_graphs)))
        return
    from common import SHARED

    args.input = args.input or SHARED / "multi30k" / "test_2016_flickr.en"
    with tempfile.TemporaryDirectory() as work:
        if args.arch:
            args.model = untrained(args.model, args.arch, Path(work) / f"{args.arch}.pt")
        source = Path(work) / "input.txt"
        with open(args.input, encoding="utf-8") as f:
            source.write_text("".join(line for _, line in zip(range(args.lines), f)), encoding="utf-8")
        graphs = ["--cuda-graphs"] if args.cuda_graphs else []
        command = [sys.executable, "-m", "nmt_cli", "translate", "-m", str(args.model), "-i", str(source),
                   "-o", str(Path(work) / "output.txt"), "--device", args.device, *graphs]
        seconds = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True)
            seconds.append(round(time.perf_counter() - start, 2))
        breakdown = subprocess.run([sys.executable, __file__, "-m", str(args.model), "-i", str(source),
                                    "--device", args.device, "--stages", *graphs], check=True, capture_output=True,
                                   text=True)
    print(json.dumps({"benchmark": "translate_startup", "model": args.arch or str(args.model), "lines": args.lines,
                      "device": args.device, "cuda_graphs": args.cuda_graphs, "seconds": seconds,
                      "median_s": statistics.median(seconds), "stages_s": json.loads(breakdown.stdout)}))


if __name__ == "__main__":
    main()
