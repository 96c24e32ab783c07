"""Is stop + resume bit-identical across CPU kernel paths? `python tests/benchmarks/resume_paths.py [--updates 30]`

Trains a 2+2-layer model for 30 updates on one thread: straight through under AVX-512 and under
AVX2, stopped halfway and resumed on the same path, and stopped under AVX-512 then resumed under
AVX2 (kernel paths chosen by ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA, MKL_ENABLE_INSTRUCTIONS),
and prints, per pair of runs, whether the final parameters are bit-identical or their largest
difference. On a CPU without AVX-512 both paths are AVX2.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import kernel_environment  # noqa: E402
from conftest import synthetic_data_dir  # noqa: E402

from nmt_cli.model import checkpoint as ckpt  # noqa: E402


def train(data: Path, save_dir: Path, updates: int, path: str) -> None:
    env = {**kernel_environment(path), "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "nmt_cli", "train", str(data), "--save-dir", str(save_dir), "--arch",
                    "small", "--encoder-layers", "2", "--decoder-layers", "2", "--d-model", "128", "--d-ff", "512",
                    "--heads", "4", "--max-tokens", "300", "--max-updates", str(updates), "--warmup", "10",
                    "--threads", "1", "--device", "cpu", "--quiet"], check=True, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--updates", type=int, default=30, help="updates of each run (stopped at half)")
    n = parser.parse_args().updates
    with tempfile.TemporaryDirectory() as work:
        tmp = Path(work)
        data = synthetic_data_dir(tmp)
        runs = {"straight avx512": [(n, "avx512")], "straight avx2": [(n, "avx2")],
                "avx512 resumed on avx512": [(n // 2, "avx512"), (n, "avx512")],
                "avx512 resumed on avx2": [(n // 2, "avx512"), (n, "avx2")]}
        params = {}
        for i, (name, steps) in enumerate(runs.items()):
            for updates, path in steps:
                train(data, tmp / f"run{i}", updates, path)
            params[name] = ckpt.load(tmp / f"run{i}/checkpoint_last.pt")["model"]
    for a, b in (("avx512 resumed on avx512", "straight avx512"), ("avx512 resumed on avx2", "straight avx512"),
                 ("straight avx2", "straight avx512")):
        same = all(torch.equal(params[a][k], params[b][k]) for k in params[a])
        diff = max((params[a][k].float() - params[b][k].float()).abs().max().item() for k in params[a])
        print(f"{a} vs {b}: {'bit-identical' if same else f'differ, largest difference {diff:.2e}'}")


if __name__ == "__main__":
    main()
