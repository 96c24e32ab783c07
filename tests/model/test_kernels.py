"""kernels.py: each fast path equals the plain torch operation or module it replaces (the
packed projection against the plain one is in test_search.py)."""

import importlib.util
import math
import os
import subprocess
import sys

import pytest
import torch
from builders import PAD, random_tokens, tiny_model

from nmt_cli.model import kernels
from nmt_cli.model.kernels import Dropout
from nmt_cli.text.vocab import PAD_ID
from nmt_cli.train.trainer import label_smoothed_loss


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_cpu_dropout_keeps_1_minus_p_in_each_part_of_a_draw_and_rescales(p):
    torch.manual_seed(0)
    n = 1_000_003  # not a multiple of 4: the last 64-bit draw is partly used
    x = torch.ones(n, requires_grad=True)
    drop = Dropout(p).train()
    y = drop(x)
    kept = y != 0
    sigma = math.sqrt(p * (1 - p) / (n / 4))
    for part in range(4):  # the four 16-bit parts of the random integers, the sign bit's included
        assert abs(kept[part::4].float().mean().item() - (1 - p)) < 5 * sigma
    assert abs(drop.scale - 1 / (1 - p)) < 1e-4  # p taken to a multiple of 2^-16
    assert torch.allclose(y[kept], torch.full_like(y[kept], drop.scale))
    y.backward(torch.full_like(y, 2.0))
    assert torch.equal(x.grad, torch.where(kept, 2.0 * drop.scale, 0.0))
    # neighbouring elements are independent (not one part reused)
    for shift in (1, 2, 3):
        both = (kept[:-shift] & kept[shift:]).float().mean().item()
        assert abs(both - (1 - p) ** 2) < 5 * sigma


def test_cpu_dropout_near_1_drops_everything():
    drop = Dropout(1 - 2**-18).train()  # rounds to all 2^16 values dropped: no division by zero
    assert drop.scale == 0.0
    assert torch.equal(drop(torch.ones(1000)), torch.zeros(1000))


def test_dropout_is_identity_in_eval_and_seeded_in_training():
    x = torch.randn(64, 32)
    drop = Dropout(0.1)
    assert drop.eval()(x) is x
    drop.train()
    torch.manual_seed(3)
    a = drop(x)
    torch.manual_seed(3)
    assert torch.equal(a, drop(x)) and not torch.equal(a, drop(x))


@pytest.mark.parametrize("reorder", [False, True])
@pytest.mark.parametrize("grad", [False, True])
def test_append_position_equals_index_select_then_cat(reorder, grad):
    torch.manual_seed(0)
    past = torch.randn(6, 2, 5, 4, requires_grad=grad)
    new = torch.randn(9 if reorder else 6, 2, 1, 4, requires_grad=grad)
    rows = torch.tensor([5, 0, 0, 3, 2, 2, 1, 4, 5]) if reorder else None
    out = kernels.append_position(past, new, rows)
    plain = torch.cat([past.index_select(0, rows) if reorder else past, new], dim=2)
    assert torch.equal(out, plain)
    if grad:  # the gradient reaches both inputs, as through torch.cat
        weight = torch.randn_like(plain)
        expected = torch.autograd.grad((plain * weight).sum(), (past, new))
        assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad((out * weight).sum(), (past, new)), expected))


@pytest.mark.parametrize("width", [600, 601, 7960])
def test_top_k_through_chunk_maxima_equals_torch_topk(width):
    torch.manual_seed(width)
    x = torch.randn(37, width)
    x[:, [0, 1, 3]] = -math.inf  # banned tokens
    x[5, :] = -math.inf
    x[5, 2] = 0.0  # a row where only EOS is allowed: one finite entry
    x[7, width - 1] = 50.0  # the largest entry in the tail
    values, indices = kernels.top_k(x, 8)
    expected = x.topk(8, dim=1)
    assert torch.equal(values, expected.values)
    finite = values.isfinite()
    assert torch.equal(indices[finite], expected.indices[finite])  # -inf ties may take any columns
    assert torch.equal(x.gather(1, indices), values)
    assert all(len(set(row)) == 8 for row in indices.tolist())  # no column twice


def test_label_smoothed_loss_in_blocks_equals_one_block(monkeypatch):
    """The loss and gradient do not depend on how the rows are split into blocks (4 rows a block here)."""
    from nmt_cli.model.kernels import SmoothedCrossEntropy

    torch.manual_seed(1)
    logits = torch.randn(30, 50) * 4
    target = torch.randint(1, 50, (30,))
    target[5::6] = PAD_ID
    results = []
    for block in (1 << 20, 4 * 50):
        monkeypatch.setitem(SmoothedCrossEntropy.BLOCK_ELEMENTS, "cpu", block)
        x = logits.clone().requires_grad_()
        loss, nll = label_smoothed_loss(x, target, 0.1)
        loss.backward()
        results.append((loss, nll, x.grad))
    assert len(SmoothedCrossEntropy.blocks(logits)) == 8
    for one, blocks in zip(*results):
        torch.testing.assert_close(blocks, one, rtol=1e-6, atol=1e-7)


def loss_case(dtype: torch.dtype, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (50, 1000) in `dtype`, and targets with padding among them."""
    torch.manual_seed(0)
    logits = (torch.randn(50, 1000, device=device) * 3).to(dtype)
    target = torch.randint(4, 1000, (50,), device=device)
    target[::7] = PAD_ID
    return logits, target


INTERPRETED_LOSS = """
import sys, torch
from nmt_cli.model import kernels
from nmt_cli.model.triton_kernels import FusedSmoothedCrossEntropy
from nmt_cli.train import trainer
FusedSmoothedCrossEntropy.BLOCK = 256  # rows of 1,000 read in pieces of 256, the last one partial
kernels.fused_loss = lambda device: FusedSmoothedCrossEntropy  # as on a GPU
results = []
for logits, target in torch.load(sys.argv[1]):
    logits.requires_grad_()
    loss, nll = trainer.label_smoothed_loss(logits, target, 0.1)
    loss.backward()
    results.append((loss.detach(), nll, logits.grad))
torch.save(results, sys.argv[1])
"""


@pytest.fixture(scope="module")
def interpreted_triton_losses(tmp_path_factory) -> dict[torch.dtype, tuple[torch.Tensor, ...]]:
    """label_smoothed_loss through triton_kernels' fused loss, its kernels run by Triton's
    interpreter on the CPU, for each dtype's `loss_case`: loss, NLL and gradient. In a process of
    its own, as TRITON_INTERPRET must be set before Triton is first imported."""
    pytest.importorskip("triton", reason="Triton (tests: the dev extra on Linux x86_64)")
    dtypes = (torch.float32, torch.bfloat16)
    cases = tmp_path_factory.mktemp("triton") / "cases.pt"
    torch.save([loss_case(dtype) for dtype in dtypes], cases)
    subprocess.run([sys.executable, "-c", INTERPRETED_LOSS, str(cases)], check=True,
                   env={**os.environ, "TRITON_INTERPRET": "1"})
    return dict(zip(dtypes, torch.load(cases)))


@pytest.mark.parametrize("path", ["blocks", "triton", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_loss_equals_the_reference(dtype, path, monkeypatch, request):
    """Loss, NLL and gradient in float64, from logits in float32 or bf16 (mixed precision): the
    blocked loss on the CPU, triton_kernels' fused one in Triton's interpreter, and on a GPU
    whichever label_smoothed_loss takes there (the fused one where Triton runs)."""
    from nmt_cli.model.kernels import SmoothedCrossEntropy

    device = "cuda" if path == "cuda" else "cpu"
    monkeypatch.setitem(SmoothedCrossEntropy.BLOCK_ELEMENTS, device, 3 * 1000)  # several blocks of 3 rows
    logits, target = loss_case(dtype, device)
    if path == "triton":
        loss, nll, grad = request.getfixturevalue("interpreted_triton_losses")[dtype]
    else:
        if path == "cuda" and importlib.util.find_spec("triton"):
            assert kernels.fused_loss(logits.device) is not None  # the GPU takes the fused loss
        logits.requires_grad_()
        loss, nll = label_smoothed_loss(logits, target, 0.1)
        loss.backward()
        grad = logits.grad
    ref_logits = logits.detach().double().requires_grad_()
    lprobs = ref_logits.log_softmax(-1)
    real = target != PAD_ID
    ref_nll = -lprobs.gather(-1, target[:, None]).squeeze(-1)[real].sum()
    ref_loss = 0.9 * ref_nll + 0.1 * (-lprobs.mean(-1))[real].sum()
    ref_loss.backward()
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    assert nll.item() == pytest.approx(ref_nll.item(), rel=1e-5)
    tolerance = 1e-6 if dtype == torch.float32 else 1e-2  # the gradient is stored in the logits' precision
    assert ((grad.double() - ref_logits.grad).norm() / ref_logits.grad.norm()).item() < tolerance


def test_the_fused_loss_is_taken_on_a_gpu_triton_compiles_for(monkeypatch):
    """kernels.fused_loss: never on the CPU; on CUDA from compute capability 7.0 (Triton's least),
    and only where Triton imports (the GPU's machine is faked: its capability, Triton's absence)."""
    pytest.importorskip("triton", reason="Triton (tests: the dev extra on Linux x86_64)")
    from nmt_cli.model.triton_kernels import FusedSmoothedCrossEntropy

    cuda = torch.device("cuda")
    for capability, fused in (((6, 1), None), ((7, 0), FusedSmoothedCrossEntropy)):
        kernels.fused_loss.cache_clear()
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device, c=capability: c)
        assert kernels.fused_loss(cuda) is fused
        assert kernels.fused_loss(torch.device("cpu")) is None
    kernels.fused_loss.cache_clear()
    monkeypatch.setitem(sys.modules, "nmt_cli.model.triton_kernels", None)  # Triton cannot be imported
    assert kernels.fused_loss(cuda) is None
    kernels.fused_loss.cache_clear()  # the real machine's answers again


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_written_out_attention_equals_the_fused_kernel(norm, monkeypatch):
    """With the fast paths, short sequences on the CPU take the written-out attention (test_model
    checks its masks); the fused kernel, which longer ones take, gives the same outputs and
    gradients."""
    import nmt_cli.model.transformer as model_module

    model = kernels.use_fast_paths(tiny_model(norm=norm).train())  # dropout 0: both runs see one function
    src = torch.cat([random_tokens(2, 9), torch.cat([random_tokens(1, 5), torch.full((1, 4), PAD)], 1)])
    tgt = torch.cat([random_tokens(2, 7), torch.cat([random_tokens(1, 3), torch.full((1, 4), PAD)], 1)])

    fused_calls = []
    sdpa = model_module.F.scaled_dot_product_attention
    monkeypatch.setattr(model_module.F, "scaled_dot_product_attention",
                        lambda *args, **kwargs: fused_calls.append(1) or sdpa(*args, **kwargs))

    def run() -> tuple[torch.Tensor, list[torch.Tensor]]:
        out = model(src, tgt)
        return out, list(torch.autograd.grad((out * torch.linspace(-1, 1, out.size(-1))).sum(), model.parameters()))

    written_out, written_out_grads = run()
    assert not fused_calls  # every attention of the model written out
    monkeypatch.setattr(kernels, "WRITTEN_OUT_MAX_KEYS", 0)
    fused, fused_grads = run()
    layers = model.config.encoder_layers + 2 * model.config.decoder_layers
    assert len(fused_calls) == layers  # and now every one fused
    torch.testing.assert_close(written_out, fused, rtol=0, atol=1e-5)
    for a, b in zip(written_out_grads, fused_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_the_fast_paths_are_module_swaps_that_leave_the_function_alone():
    model = tiny_model(dropout=0.1, attention_dropout=0.1, relu_dropout=0.1)
    plain = {name: type(m) for name, m in model.named_modules()}
    src, tgt = random_tokens(2, 6), random_tokens(2, 5)
    before = model(src, tgt)
    assert kernels.use_fast_paths(model) is model and kernels.use_fast_paths(model) is model  # idempotent
    swapped = {name: type(m) for name, m in model.named_modules() if type(m) is not plain.get(name)}
    assert set(swapped.values()) == {kernels.Dropout, kernels.WrittenOutAttention}
    assert sum(t is kernels.WrittenOutAttention for t in swapped.values()) == 2 + 2 * 2  # every attention
    assert all(m.p == 0.1 for m in model.modules() if isinstance(m, kernels.Dropout))
    torch.testing.assert_close(model(src, tgt), before, rtol=0, atol=1e-5)  # eval: the same function


@pytest.mark.parametrize("variant", [{}, {"output_bias": True}, {"tied_output": False}, "int8"])
def test_a_shortlists_projection_equals_the_columns_of_the_whole(variant):
    """ShortlistProjection(model).rows(columns)(x) == the model's projection(x)[:, columns], computed
    for those columns alone: packed in float32, or the same int8 rows and scales."""
    model = tiny_model(seed=4, **({} if variant == "int8" else variant)).eval()
    if variant == "int8":
        kernels.quantize_int8(model, torch.device("cpu"), torch.float32)
    elif model.output_projection.bias is not None:
        torch.nn.init.normal_(model.output_projection.bias)
    columns = torch.tensor([2, 3, 5, 8, 13, 21])
    x = torch.randn(7, model.config.d_model)
    with torch.inference_mode():
        whole = model.output_projection(x)[:, columns]
        restricted = kernels.ShortlistProjection(model).rows(columns)(x)
    assert restricted.shape == (7, len(columns))
    assert torch.allclose(restricted, whole, atol=1e-5 if variant != "int8" else 1e-4)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_int8_with_the_relu_fused_equals_torch_ao_quantizing_every_linear_alone(activation):
    """quantize_int8 runs a ReLU feed-forward's max(0, .) inside its first int8 product: the same
    numbers as torch.ao's dynamic quantization of each linear layer with the ReLU after it."""
    import copy

    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    model = tiny_model(seed=5, activation=activation)
    alone = quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)
    kernels.quantize_int8(model, torch.device("cpu"), torch.float32)
    fused = [m for m in model.modules() if isinstance(m, kernels.FusedFeedForward)]
    assert len(fused) == (2 + 2 if activation == "relu" else 0)  # every feed-forward of a ReLU model
    src, tgt = random_tokens(3, 7), random_tokens(3, 6)
    with torch.inference_mode():
        assert torch.equal(model(src, tgt), alone(src, tgt))
