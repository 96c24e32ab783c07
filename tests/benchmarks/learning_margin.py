"""How far above its bar `test_learns_to_reverse_sequences` lands on each CPU kernel path.

`python tests/benchmarks/learning_margin.py [--device cpu|cuda] [--paths avx512 avx2 default] [--max-updates N]`
trains the test's recipe once per path, in a fresh process with PyTorch's, oneDNN's and MKL's
kernel selection set (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS), and
prints one JSON line per path: exact match and BLEU of the best and the last checkpoint, fp32
and int8, against the test's bar (0.9 and 90). A path the CPU lacks falls back to the best it has.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from common import KERNEL_PATHS, kernel_environment

TESTS = Path(__file__).resolve().parents[1]


def one_run(device: str, max_updates: int | None) -> dict:
    sys.path.insert(0, str(TESTS))
    import dataclasses

    import sacrebleu
    import torch
    from conftest import SYMBOLS, synthetic_data_dir
    from test_end_to_end import REVERSAL_MODEL, REVERSAL_TRAINING

    from nmt_cli.config import SearchConfig
    from nmt_cli.decode.engine import Engine
    from nmt_cli.decode.translate import translate_lines
    from nmt_cli.model import checkpoint as ckpt
    from nmt_cli.run_config import RunConfig
    from nmt_cli.train.run import TrainingRun

    rng = random.Random(12345)
    inputs = [" ".join(rng.choice(SYMBOLS) for _ in range(rng.randint(3, 10))) for _ in range(200)]
    expected = [" ".join(reversed(line.split())) for line in inputs]
    result = {"device": device, "capability": torch.backends.cpu.get_cpu_capability()}
    with tempfile.TemporaryDirectory() as work:
        tmp = Path(work)
        data = synthetic_data_dir(tmp, n_train=2000, task="reverse", min_len=3, max_len=10)
        config = dataclasses.replace(REVERSAL_TRAINING, device=device,
                                     max_updates=max_updates or REVERSAL_TRAINING.max_updates)
        TrainingRun(data, tmp / "ck", REVERSAL_MODEL, config, progress_bar=False).run()
        for name in ("best", "last"):
            for quantize in (None, "int8"):
                engine = Engine([ckpt.load_bundle(tmp / f"ck/checkpoint_{name}.pt")],
                                        RunConfig(SearchConfig(beam=4), quantize=quantize), torch.device("cpu"))
                outputs = translate_lines(engine, inputs)
                exact = sum(o == e for o, e in zip(outputs, expected)) / len(inputs)
                bleu = sacrebleu.corpus_bleu(outputs, [expected], tokenize="none").score
                result[f"{name}_{quantize or 'fp32'}"] = [round(exact, 3), round(bleu, 1)]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--paths", nargs="*", default=list(KERNEL_PATHS), choices=list(KERNEL_PATHS))
    parser.add_argument("--max-updates", type=int, help="fewer updates than the test's (a smoke run)")
    parser.add_argument("--one", action="store_true", help="one run in this process (used by the others)")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args.device, args.max_updates)), flush=True)
        return
    for path in args.paths:
        more = ["--max-updates", str(args.max_updates)] if args.max_updates else []
        out = subprocess.run([sys.executable, __file__, "--one", "--device", args.device, *more],
                             env=kernel_environment(path),
                             check=True, capture_output=True, text=True).stdout
        print(json.dumps({"path": path, **json.loads(out.strip().splitlines()[-1])}), flush=True)


if __name__ == "__main__":
    main()
