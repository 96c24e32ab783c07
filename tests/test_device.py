"""Device and precision choice, shared by `nmt train` and `nmt translate`, and the process settings
the commands tune."""

import ctypes
import platform

import pytest
import torch
from click.testing import CliRunner
from conftest import tiny_checkpoint

from nmt_cli import device
from nmt_cli.cli import main
from nmt_cli.device import native_bf16, select
from nmt_cli.errors import NmtError


def test_cpu_defaults_to_fp32():
    assert select("cpu", "auto") == (torch.device("cpu"), torch.float32)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_without_a_gpu_is_a_clear_error(tmp_path):
    with pytest.raises(NmtError, match="--device cuda: no CUDA device is available"):
        select("cuda", "auto")
    result = CliRunner().invoke(main, ["translate", "-m", str(tiny_checkpoint(tmp_path / "m.pt")), "--device",
                                       "cuda"], input="a\n")
    assert result.exit_code == 1 and "no CUDA device" in result.output


def test_fp16_needs_cuda(tmp_path):
    with pytest.raises(NmtError, match=r"--precision fp16 needs a GPU \(CUDA or MPS\); use fp32 or bf16 on CPU"):
        select("cpu", "fp16")
    result = CliRunner().invoke(main, ["translate", "-m", str(tiny_checkpoint(tmp_path / "m.pt")), "--device", "cpu",
                                       "--precision", "fp16"], input="a\n")
    assert result.exit_code == 1 and "needs a GPU" in result.output


def test_a_gpu_is_named_as_torch_names_it(monkeypatch, tmp_path):
    """cuda:N picks one GPU (checked against those there are); mps is the Apple GPU; a name
    torch would not take is refused where it is parsed."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert select("cuda:1", "auto") == (torch.device("cuda", 1), torch.bfloat16)
    assert select("cuda", "fp32", index=1) == (torch.device("cuda", 1), torch.float32)  # torchrun's local rank
    with pytest.raises(NmtError, match=r"^--device cuda:2: this machine has 2 CUDA device\(s\), cuda:0 to cuda:1$"):
        select("cuda:2", "auto")
    with pytest.raises(NmtError, match="under torchrun give --device cuda"):
        select("cuda:1", "auto", index=1)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert select("mps", "auto") == (torch.device("mps"), torch.float32)
    assert select("mps", "fp16") == (torch.device("mps"), torch.float16)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(NmtError, match=r"^--device mps: no Apple GPU \(MPS\) is available here; use cpu$"):
        select("mps", "auto")
    result = CliRunner().invoke(main, ["translate", "-m", str(tiny_checkpoint(tmp_path / "m.pt")), "--device", "gpu"],
                                input="a\n")
    assert result.exit_code == 2 and "device='gpu': expected auto, cpu, cuda, cuda:N or mps" in result.output


def test_bf16_on_the_cpu(tmp_path):
    """bf16 runs on the CPU (mixed precision in training, a bf16 model in translation); auto stays fp32."""
    assert select("cpu", "bf16") == (torch.device("cpu"), torch.bfloat16)
    assert select("cpu", "auto") == (torch.device("cpu"), torch.float32)
    model = str(tiny_checkpoint(tmp_path / "m.pt"))
    outputs = [CliRunner().invoke(main, ["translate", "-m", model, "--device", "cpu", "--precision", precision],
                                  input="a b\nc\n") for precision in ("bf16", "fp32")]
    assert [r.exit_code for r in outputs] == [0, 0]
    assert len(outputs[0].stdout.splitlines()) == len(outputs[1].stdout.splitlines()) == 2


@pytest.mark.parametrize("avx512_bf16, amx, native", [(False, False, False), (True, False, True), (False, True, True)])
def test_native_bf16_on_the_cpu_is_avx512_bf16_or_amx(monkeypatch, avx512_bf16, amx, native):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    assert native_bf16("cpu") is native
    assert select("cpu", "auto")[1] == torch.float32  # auto stays fp32 on a CPU: bf16 is asked for


def test_quantize_with_device_auto_runs_on_the_cpu_where_there_is_a_gpu(tmp_path, monkeypatch):
    """int8 matmuls are a CPU kernel: with --quantize, device auto means the CPU on a GPU machine too."""
    from nmt_cli.decode.translator import Translator
    from nmt_cli.run_config import RunConfig

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert RunConfig(quantize="int8").run_on == "cpu" and RunConfig().run_on == "auto"
    assert RunConfig(quantize="int8", device="cuda").run_on == "cuda"  # asked for: refused by the generator
    assert Translator.load(tiny_checkpoint(tmp_path / "m.pt"), quantize="int8").engine.device == torch.device("cpu")


def test_keep_freed_memory_tunes_glibc_malloc_and_is_harmless_elsewhere(monkeypatch):
    if platform.libc_ver()[0] == "glibc":  # Linux, as in CI
        assert device.keep_freed_memory()
        sbrk = ctypes.CDLL(None).sbrk
        sbrk.restype = ctypes.c_void_p
        block = torch.empty(1 << 24)  # 64 MB: above the largest mmap threshold glibc accepts (32 MB)
        assert block.data_ptr() < sbrk(0)  # below the program break: the heap, not a fresh mapping
    monkeypatch.setattr(device.ctypes, "CDLL", lambda name: object())  # a C library without mallopt
    assert not device.keep_freed_memory()


def test_translator_load_changes_no_setting_of_the_callers_process_but_the_threads_asked(tmp_path, monkeypatch):
    """The commands tune the process (device.tune); a library call does not, unless asked."""
    changed = []
    monkeypatch.setattr(torch, "set_flush_denormal", lambda on: changed.append("denormals"))
    monkeypatch.setattr(device, "keep_freed_memory", lambda: changed.append("malloc"))
    threads = torch.get_num_threads()
    model = tiny_checkpoint(tmp_path / "m.pt")
    from nmt_cli.decode.translator import Translator

    Translator.load(model, device="cpu")
    assert changed == [] and torch.get_num_threads() == threads
    try:
        Translator.load(model, device="cpu", threads=1)
        assert changed == [] and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    device.tune(torch.device("cpu"))
    assert changed == ["denormals", "malloc"]
