"""Where and in what precision to run (one choice, shared by training and translation), the
process settings the commands run with (`tune`), and what a device asks of the work on it: how
much of a search step's output at once (`block_floats`), how often the host reads the device
(`steps_between_reads`)."""

from __future__ import annotations

import ctypes

import torch

from nmt_cli.errors import NmtError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def select(device: str, precision: str, index: int = 0) -> tuple[torch.device, torch.dtype]:
    """`device` auto|cpu|cuda|cuda:N|mps and `precision` auto|fp32|bf16|fp16 -> (torch device,
    compute dtype).

    auto precision is bf16 on a CUDA GPU that supports it, else fp32; bf16 runs on the CPU too
    (fast where the CPU multiplies bf16 itself: AVX512-BF16 or AMX), fp16 needs a GPU. `index`
    is the CUDA device of plain `cuda` (torchrun's LOCAL_RANK). Changes nothing in the process:
    `tune` does.
    """
    cuda = uses_cuda(device)
    if device == "mps" and not torch.backends.mps.is_available():
        raise NmtError("--device mps: no Apple GPU (MPS) is available here; use cpu")
    if precision == "auto":
        precision = "bf16" if cuda and native_bf16(device) else "fp32"
    if precision == "fp16" and not (cuda or device == "mps"):
        raise NmtError("--precision fp16 needs a GPU (CUDA or MPS); use fp32 or bf16 on CPU")
    if device == "mps":
        return torch.device("mps"), DTYPES[precision]
    return (cuda_device(device, index) if cuda else torch.device("cpu")), DTYPES[precision]


def cuda_device(device: str, index: int) -> torch.device:
    """The CUDA device that `device` names: cuda:N, or for cuda (and auto) device `index`."""
    if ":" not in device:
        return torch.device("cuda", index)
    named, count = int(device.partition(":")[2]), torch.cuda.device_count()
    if named >= count:
        raise NmtError(f"--device {device}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    if index:
        raise NmtError(f"--device {device} would put every process on one GPU; under torchrun give --device cuda "
                       "(each process takes the GPU of its local rank)")
    return torch.device("cuda", named)


def tune(device: torch.device, threads: int | None = None) -> None:
    """The process settings the commands run with, for the rest of the process: `threads` for
    PyTorch's CPU work; denormals flushed (tiny Adam moments as denormals make CPU arithmetic far
    slower); on a GPU, cuDNN's attention off (SDPA prefers it on Hopper with a padding mask, and it
    builds an execution plan on the host for every new batch shape: with length-bucketed batches,
    every batch; flash and memory-efficient attention need none); on the CPU, freed memory kept
    for reuse (`keep_freed_memory`). The Python API's Translator sets threads only when asked."""
    if threads:
        torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)
    else:
        keep_freed_memory()


def block_floats(device: torch.device) -> int:
    """Log-probabilities a search step computes at once (rows x vocabulary, `ensemble.Ensemble.
    top_tokens`): on the CPU 16 MB of float32, which stay in cache until they are read again; on
    a GPU up to 1 GB, so that a step is one projection, softmax and top-k, not a few kernel
    launches per block."""
    return 1 << 22 if device.type == "cpu" else 1 << 28


def steps_between_reads(device: torch.device) -> int:
    """Search steps between reads of which sentences are done, and training updates between reads
    of their losses. A read makes the host wait for the device: on the CPU that costs nothing (and
    done sentences leave the batch at once); on a GPU the host queues the next steps' kernels
    meanwhile instead of waiting for each step."""
    return 1 if device.type == "cpu" else 8


def uses_cuda(device: str) -> bool:
    """Whether `device` auto|cpu|cuda|cuda:N|mps means a CUDA GPU here (auto: when there is one)."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise NmtError(f"--device {device}: no CUDA device is available")
    return torch.cuda.is_available() if device == "auto" else device.startswith("cuda")


def native_bf16(device: str) -> bool:
    """Whether `device` auto|cpu|cuda multiplies bf16 in hardware: a CUDA GPU that supports it, a
    CPU with AVX512-BF16 or AMX. Elsewhere bf16 arithmetic is emulated, slower than fp32."""
    if uses_cuda(device):
        return torch.cuda.is_bf16_supported()
    return any(getattr(torch.cpu, name, lambda: False)() for name in ("_is_avx512_bf16_supported",
                                                                     "_is_amx_tile_supported"))


def out_of_memory(error: BaseException) -> bool:
    """Whether `error` is a device running out of memory: CUDA's OutOfMemoryError, or the
    RuntimeError of PyTorch's CPU or MPS allocator."""
    return isinstance(error, torch.cuda.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and ("can't allocate memory" in str(error)
                                             or "MPS backend out of memory" in str(error)))


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for reuse rather than return it to the system:
    every block comes from the heap (no fresh mapping per large tensor), and the heap is not
    trimmed. A fresh mapping costs a page fault per 4 KB at first touch, which for the large
    tensors of every training step and search step costs more than filling them (measured by
    tests/benchmarks/train_speed.py and decode_speed.py). The process keeps its peak memory until
    it exits. False (nothing changed) without glibc.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_top_pad, m_mmap_max = -1, -2, -4
    settings = ((m_mmap_max, 0), (m_trim_threshold, 1 << 30), (m_top_pad, 256 << 20))
    return all(mallopt(option, value) == 1 for option, value in settings)
