"""Where and in what precision to run: one choice, shared by training and translation."""

from __future__ import annotations

import ctypes

import torch

from nmt_cli import NmtError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def select(device: str, precision: str, threads: int | None = None, index: int = 0) -> tuple[torch.device, torch.dtype]:
    """`device` auto|cpu|cuda and `precision` auto|fp32|bf16|fp16 -> (torch device, compute dtype).

    auto precision is bf16 on a CUDA GPU that supports it, else fp32; half precisions need CUDA.
    `index` is the CUDA device (torchrun's LOCAL_RANK). On the CPU, freed memory is kept for
    reuse (`keep_freed_memory`).
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
    if cuda:
        # cuDNN's attention, which SDPA prefers on Hopper when there is a padding mask, builds an
        # execution plan for every new (batch, length) shape, on the host: with length-bucketed
        # batches that is every batch. Flash and memory-efficient attention need no plan.
        torch.backends.cuda.enable_cudnn_sdp(False)
    else:
        keep_freed_memory()
    return (torch.device("cuda", index) if cuda else torch.device("cpu")), DTYPES[precision]


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for reuse rather than return it to the system:
    every block comes from the heap (no fresh mapping per large tensor), and the heap is not
    trimmed. A fresh mapping costs a page fault per 4 KB at first touch, which on a 2-core VM
    made allocating a tensor cost 5-8x more than filling it. Decoding (tens of MB per step) had
    half the page faults and ran about 6% faster; training (the 100 MB logits and their gradient
    in each batch) ran 13-18% faster for 10-17% more peak memory. The process keeps its peak
    memory until it exits. False (nothing changed) without glibc.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_top_pad, m_mmap_max = -1, -2, -4
    settings = ((m_mmap_max, 0), (m_trim_threshold, 1 << 30), (m_top_pad, 256 << 20))
    return all(mallopt(option, value) == 1 for option, value in settings)
