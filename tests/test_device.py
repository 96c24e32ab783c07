"""Device and precision choice, shared by `nmt train` and `nmt translate`."""

import pytest
import torch
from click.testing import CliRunner
from conftest import tiny_checkpoint

from nmt_cli.cli import main
from nmt_cli.device import select
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


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_half_precision_needs_cuda(tmp_path, precision):
    with pytest.raises(NmtError, match=f"--precision {precision} needs a CUDA device; use fp32 on CPU"):
        select("cpu", precision)
    result = CliRunner().invoke(main, ["translate", "-m", str(tiny_checkpoint(tmp_path / "m.pt")), "--device", "cpu",
                                       "--precision", precision], input="a\n")
    assert result.exit_code == 1 and "needs a CUDA device" in result.output
