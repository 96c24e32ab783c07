"""Where and in what precision to run: one choice, shared by training and translation."""

from __future__ import annotations

import torch

from nmt_cli.errors import NmtError
from nmt_cli.kernels import keep_freed_memory

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def select(device: str, precision: str, threads: int | None = None, index: int = 0) -> tuple[torch.device, torch.dtype]:
    """`device` auto|cpu|cuda and `precision` auto|fp32|bf16|fp16 -> (torch device, compute dtype).

    auto precision is bf16 on a CUDA GPU that supports it, else fp32; bf16 runs on the CPU too
    (fast where the CPU multiplies bf16 itself: AVX512-BF16 or AMX), fp16 needs CUDA.
    `index` is the CUDA device (torchrun's LOCAL_RANK). On the CPU, freed memory is kept for
    reuse (`keep_freed_memory`).
    """
    if threads:
        torch.set_num_threads(threads)
    torch.set_flush_denormal(True)  # tiny Adam moments as denormals make CPU arithmetic far slower
    cuda = uses_cuda(device)
    if precision == "auto":
        precision = "bf16" if cuda and native_bf16(device) else "fp32"
    if precision == "fp16" and not cuda:
        raise NmtError("--precision fp16 needs a CUDA device; use fp32 or bf16 on CPU")
    if cuda:
        # cuDNN's attention, which SDPA prefers on Hopper when there is a padding mask, builds an
        # execution plan for every new (batch, length) shape, on the host: with length-bucketed
        # batches that is every batch. Flash and memory-efficient attention need no plan.
        torch.backends.cuda.enable_cudnn_sdp(False)
    else:
        keep_freed_memory()
    return (torch.device("cuda", index) if cuda else torch.device("cpu")), DTYPES[precision]


def uses_cuda(device: str) -> bool:
    """Whether `device` auto|cpu|cuda means a CUDA GPU here (auto: when there is one)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise NmtError("--device cuda: no CUDA device is available")
    return torch.cuda.is_available() if device == "auto" else device == "cuda"


def native_bf16(device: str) -> bool:
    """Whether `device` auto|cpu|cuda multiplies bf16 in hardware: a CUDA GPU that supports it, a
    CPU with AVX512-BF16 or AMX. Elsewhere bf16 arithmetic is emulated, slower than fp32."""
    if uses_cuda(device):
        return torch.cuda.is_bf16_supported()
    return any(getattr(torch.cpu, name, lambda: False)() for name in ("_is_avx512_bf16_supported",
                                                                     "_is_amx_tile_supported"))


def out_of_memory(error: BaseException) -> bool:
    """Whether `error` is a device running out of memory: CUDA's OutOfMemoryError, or the
    RuntimeError of PyTorch's CPU allocator."""
    return isinstance(error, torch.cuda.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and "can't allocate memory" in str(error))
