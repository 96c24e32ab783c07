"""Where and in what precision to run: one choice, shared by training and translation."""

from __future__ import annotations

import torch

from nmt_cli import NmtError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def select(device: str, precision: str, threads: int | None = None, index: int = 0) -> tuple[torch.device, torch.dtype]:
    """`device` auto|cpu|cuda and `precision` auto|fp32|bf16|fp16 -> (torch device, compute dtype).

    auto precision is bf16 on a CUDA GPU that supports it, else fp32; half precisions need CUDA.
    `index` is the CUDA device (torchrun's LOCAL_RANK).
    """
    if threads:
        torch.set_num_threads(threads)
    torch.set_flush_denormal(True)  # tiny Adam moments as denormals make CPU arithmetic far slower
    cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise NmtError("--device cuda: no CUDA device is available")
    if precision == "auto":
        precision = "bf16" if cuda and torch.cuda.is_bf16_supported() else "fp32"
    if precision != "fp32" and not cuda:
        raise NmtError(f"--precision {precision} needs a CUDA device; use fp32 on CPU")
    return (torch.device("cuda", index) if cuda else torch.device("cpu")), DTYPES[precision]
