"""Machine-specific fast paths, each a drop-in replacement for a plain torch operation or one of
the model's modules, and tested equal to it (tests/model/test_kernels.py). The paper's model
(transformer.py) knows none of them: `use_fast_paths` swaps its modules for the ones here, and the
search (decode/search.py, decode/incremental.py) and the trainer (train/trainer.py) call the rest. A reader who wants
the paper never needs this file, nor triton_kernels.py (GPU kernels of its own), nor graphs.py (the
search's decoder as CUDA graphs).

- `Dropout`: on the CPU, keep masks drawn four elements per 64-bit random integer.
- `WrittenOutAttention`: eq. 1 written out where that beats the fused kernel (a search step;
  the CPU with few keys).
- `append_position`: a search step's cache reordered and extended in one copy.
- `SmoothedCrossEntropy`: the label-smoothed loss in blocks of rows, gradient in closed form;
  `smoothed_cross_entropy` runs it, or on a GPU triton_kernels' fused version.
- `PackedProjection` / `search_projection`: the search's vocabulary projection packed once for oneDNN;
  `ShortlistProjection`: a shortlist's rows of it alone.
- `top_k`: top-k through chunk maxima on the CPU.
- `quantize_int8`: dynamic int8 linear layers for CPU inference, the feed-forward's ReLU fused
  into its first (`FusedFeedForward`).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt_cli.errors import NmtError
from nmt_cli.model.transformer import PositionwiseFeedForward, ScaledDotProductAttention, Transformer, attention
from nmt_cli.text.vocab import PAD_ID

M = TypeVar("M", bound=nn.Module)


def use_fast_paths(model: M) -> M:
    """Swap the dropout and attention modules of `model` (a Transformer, or any part of one) for
    this file's (same numbers in expectation and, for attention, the same function), in place;
    returns `model`. Idempotent."""
    for module in list(model.modules()):
        for name, child in module.named_children():
            if type(child) is nn.Dropout:
                setattr(module, name, Dropout(child.p).train(child.training))
            elif type(child) is ScaledDotProductAttention:
                fast = WrittenOutAttention(child.dropout.p)
                fast.dropout = Dropout(child.dropout.p)
                setattr(module, name, fast.train(child.training))
    return model


class Dropout(nn.Dropout):
    """Dropout (§5.4, Srivastava et al. 2014): zero each element with probability p, scale the rest
    by 1 / (1 - p).

    On CPU the keep mask is drawn as 64-bit random integers over their full range, each giving four
    elements (its four 16-bit parts, compared with one threshold), instead of torch's per-element
    Bernoulli sampler, which draws CPU random numbers on one thread (what this saves:
    tests/benchmarks/train_speed.py --dropout-ab). p is taken to a multiple of 2^-16 (0.1
    becomes 0.100006), and the scale is that of the p taken, so the expected output is exactly
    the input. Elsewhere (CUDA), and inside torch.compile, it is torch's kernel.
    """

    def __init__(self, p: float) -> None:
        super().__init__(p)
        dropped = round(p * 2**16)  # of the 2^16 values of a 16-bit part
        self.threshold = dropped - 2**15  # int16 parts below it are dropped
        self.scale = 2**16 / (2**16 - dropped) if dropped < 2**16 else 0.0

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0:
            return x
        if x.device.type != "cpu" or torch.compiler.is_compiling():  # compiled: the compiler's own masks
            return F.dropout(x, self.p, training=True)
        bits = torch.empty((x.numel() + 3) // 4, dtype=torch.int64).random_(-2**63, None)  # uniform 64 bits
        keep = (bits.view(torch.int16)[: x.numel()] >= self.threshold).view(x.shape)
        return Masked.apply(x, keep.to(x.dtype).mul_(self.scale))


class Masked(torch.autograd.Function):
    """x * mask, where the mask is a constant (no gradient, no autograd bookkeeping for it)."""

    @staticmethod
    def forward(ctx, x: Tensor, mask: Tensor) -> Tensor:
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        (mask,) = ctx.saved_tensors
        return grad * mask, None


def append_position(past: Tensor, new: Tensor, rows: Tensor | None) -> Tensor:
    """torch.cat([past.index_select(0, rows), new], dim=2) (or `past` itself without `rows`),
    written in one pass: a search's cache follows the beams it kept and grows by a position in
    the same copy, with no intermediate tensor."""
    length = past.size(2)
    out = past.new_empty(new.size(0), past.size(1), length + 1, past.size(3))
    if rows is None:
        out[:, :, :length] = past
    elif past.requires_grad:  # out= is not differentiable: the same in two copies
        out[:, :, :length] = past.index_select(0, rows)
    else:
        torch.index_select(past, 0, rows, out=out[:, :, :length])
    out[:, :, length:] = new
    return out


# On the CPU, attention over at most this many keys is written out rather than fused.
WRITTEN_OUT_MAX_KEYS = 64


def written_out_attention(q: Tensor, k: Tensor) -> bool:
    """Whether eq. 1 written out is faster than the fused kernel here: for one query per row (a
    search step) on every device, and on the CPU for short sequences (sentences of up to 64
    tokens), backward included (tests/benchmarks/attention_speed.py). Never inside torch.compile,
    which fuses the kernel itself."""
    if torch.compiler.is_compiling():
        return False
    return q.size(-2) == 1 or (q.device.type == "cpu" and k.size(-2) <= WRITTEN_OUT_MAX_KEYS)


class WrittenOutAttention(ScaledDotProductAttention):
    """The model's attention (eq. 1), written out (model.attention) where `written_out_attention`
    says that is faster, else torch's fused kernel: the same function either way."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        if not self.keep_weights and written_out_attention(q, k):
            return attention(q, k, v, mask, causal, self.dropout)[0]
        return super().forward(q, k, v, mask, causal)


class SmoothedCrossEntropy(torch.autograd.Function):
    """Per-token label-smoothed loss and NLL, computed in float32 over blocks of rows of the
    logits, with the gradient in closed form: d loss / d logits = softmax - (1 - eps) *
    onehot(target) - eps / V.

    Only each row's log-normalizer (logsumexp) is kept for the backward pass, never the
    (tokens, V) float32 log-probabilities: with bf16 logits on a GPU that matrix would be twice
    the logits' size, written and read again in several full passes. The block size keeps the
    CPU's passes within its caches and the GPU's kernels large (`BLOCK_ELEMENTS`).
    """

    BLOCK_ELEMENTS = {"cpu": 1 << 20, "cuda": 1 << 26}

    @staticmethod
    def blocks(logits: Tensor) -> range:
        rows = max(1, SmoothedCrossEntropy.BLOCK_ELEMENTS.get(logits.device.type, 1 << 26) // logits.size(-1))
        return range(0, logits.size(0), rows)

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
        blocks = SmoothedCrossEntropy.blocks(logits)
        normalizer = logits.new_empty(logits.size(0), dtype=torch.float32)
        target_logit, mean_logit = torch.empty_like(normalizer), torch.empty_like(normalizer)
        for start in blocks:
            block = logits[start:start + blocks.step].float()
            rows = slice(start, start + block.size(0))
            torch.logsumexp(block, dim=-1, out=normalizer[rows])
            target_logit[rows] = block.gather(-1, target[rows, None]).squeeze(-1)
            torch.mean(block, dim=-1, out=mean_logit[rows])
        real = (target != PAD_ID).float()
        nll = (normalizer - target_logit) * real
        uniform = (normalizer - mean_logit) * real
        ctx.save_for_backward(logits, target, real, normalizer)
        ctx.epsilon = epsilon
        ctx.mark_non_differentiable(nll)
        return (1 - epsilon) * nll + epsilon * uniform, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor, None, None]:
        logits, target, real, normalizer = ctx.saved_tensors
        blocks = SmoothedCrossEntropy.blocks(logits)
        weight = (grad_loss * real)[:, None]
        grad = torch.empty_like(logits)
        epsilon, vocab = ctx.epsilon, logits.size(-1)
        for start in blocks:
            rows = slice(start, start + blocks.step)
            # softmax, float32 (.float() first: a bf16 - float32 subtraction is several times slower on a CPU)
            block = torch.sub(logits[rows].float(), normalizer[rows, None]).exp_()
            block.sub_(epsilon / vocab)
            block.scatter_add_(-1, target[rows, None], torch.full_like(weight[rows], epsilon - 1))
            grad[rows] = block.mul_(weight[rows])
        return grad, None, None


def smoothed_cross_entropy(logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """Per-token label-smoothed loss and NLL of `logits` (tokens, V), as `SmoothedCrossEntropy`
    defines them: on a GPU that Triton compiles for, its fused kernels (one read of the logits
    forward, one read and one write backward); elsewhere `SmoothedCrossEntropy` itself."""
    return (fused_loss(logits.device) or SmoothedCrossEntropy).apply(logits, target, epsilon)


@functools.cache
def fused_loss(device: torch.device) -> type[torch.autograd.Function] | None:
    """triton_kernels.FusedSmoothedCrossEntropy where it runs: a CUDA GPU of compute capability 7.0
    or later (Triton's least), with Triton installed (PyTorch's CUDA builds bring it)."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (7, 0):
        return None
    try:
        from nmt_cli.model.triton_kernels import FusedSmoothedCrossEntropy
    except ImportError:
        return None
    return FusedSmoothedCrossEntropy


class PackedProjection:
    """x W^T (+ b) with W reordered once into oneDNN's blocked layout, for CPU inference in float32.

    F.linear hands MKL the plain weight, which it repacks at every call; the pre-softmax
    projection is the largest matrix and runs at every step of a search, so it is packed once per
    search (measured by tests/benchmarks/decode_speed.py). The packed copy does not follow later
    changes to the weight, so it lives with an Ensemble, never in the model. It uses the oneDNN
    ops of torch.compile's CPU backend; RuntimeError or AttributeError where PyTorch has none.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
        self.bias = bias.detach().contiguous() if bias is not None else None
        self(weight[:1].detach())  # a missing kernel fails here, not in the middle of a search

    def __call__(self, x: Tensor) -> Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def search_projection(model: Transformer) -> Callable[[Tensor], Tensor]:
    """The model's pre-softmax projection as a search should run it: packed where it can be
    (float32 on the CPU), int8 where the model is quantized."""
    projection = model.output_projection
    if type(projection) is not nn.Linear:  # int8 (quantize_int8)
        return projection
    return _packed(projection.weight, projection.bias) or projection


def _packed(weight: Tensor, bias: Tensor | None) -> PackedProjection | None:
    """x W^T + b packed, where this PyTorch and device can (float32 on the CPU)."""
    if weight.device.type == "cpu" and weight.dtype == torch.float32:
        try:
            return PackedProjection(weight, bias)
        except (RuntimeError, AttributeError):
            pass
    return None


class ShortlistProjection:
    """A model's pre-softmax projection restricted to a shortlist's columns as a search runs it:
    `rows(columns)(x) == projection(x)[:, columns]`, computed for those columns alone (made once
    per batch). Float32: the weight's rows packed. Int8: the same int8 rows and scales, from the
    weight unpacked once here (unpacking it per batch cost more than a one-sentence search)."""

    def __init__(self, model: Transformer) -> None:
        projection = model.output_projection
        self.quantized = type(projection) is not nn.Linear  # int8 (quantize_int8)
        if self.quantized:
            weight, self.bias = projection._weight_bias()  # torch.ao's own accessor
            self.weight = weight.int_repr()
            self.scales, self.zero_points = weight.q_per_channel_scales(), weight.q_per_channel_zero_points()
        else:
            self.weight, self.bias = projection.weight, projection.bias

    def rows(self, columns: Tensor) -> Callable[[Tensor], Tensor]:
        """The projection to `columns` (sorted target ids) alone."""
        weight = self.weight.index_select(0, columns)
        bias = None if self.bias is None else self.bias.index_select(0, columns)
        if not self.quantized:
            return _packed(weight, bias) or (lambda x: F.linear(x, weight, bias))
        from torch.ao.nn.quantized.dynamic import Linear as QuantizedLinear

        rows = torch._make_per_channel_quantized_tensor(weight, self.scales.index_select(0, columns),
                                                        self.zero_points.index_select(0, columns), 0)
        restricted = QuantizedLinear(weight.size(1), len(columns), dtype=torch.qint8)
        restricted.set_weight_bias(rows, bias)
        return restricted


def top_k(x: Tensor, k: int, chunks: int = 8) -> tuple[Tensor, Tensor]:
    """x.topk(k, dim=1) for a wide x (rows, vocab), faster on the CPU.

    Each row is cut into `chunks` equal parts (plus a short tail), laid over each other, and
    each position takes its maximum over the parts. The k largest entries of the row lie at the
    k positions with the largest maxima (any other position has k positions above it, each
    holding a larger entry), so only those positions of every part, and the tail, are
    candidates; a maximum over parts costs far less per entry than torch.topk's CPU kernel
    (measured by tests/benchmarks/decode_speed.py). Off the CPU, or for a narrow x, it is
    torch.topk.
    """
    rows, width = x.shape
    part = width // chunks
    if x.device.type != "cpu" or part < 8 * k:
        return x.topk(k, dim=1)
    columns = x[:, : part * chunks].view(rows, chunks, part).amax(1).topk(k, dim=1).indices
    candidates = (columns[:, :, None] + torch.arange(0, part * chunks, part)).view(rows, -1)
    if width > part * chunks:  # the tail columns are candidates too
        tail = torch.arange(part * chunks, width).expand(rows, -1)
        candidates = torch.cat([candidates, tail], dim=1)
    top = x.gather(1, candidates).topk(k, dim=1)
    return top.values, candidates.gather(1, top.indices)


class FusedFeedForward(nn.Module):
    """Eq. 2's FFN(x) = max(0, x W1 + b1) W2 + b2 for inference, the max(0, .) inside the first
    product's kernel (torch.ao's LinearReLU: one pass over the (tokens, d_ff) output, not two).
    Dropout is left out: an int8 model is never trained."""

    def __init__(self, ffn: PositionwiseFeedForward) -> None:
        super().__init__()
        from torch.ao.nn.intrinsic import LinearReLU

        self.w1, self.w2 = LinearReLU(ffn.w1, nn.ReLU()), ffn.w2

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(self.w1(x))


@torch.no_grad()
def quantize_int8(model: Transformer, device: torch.device, dtype: torch.dtype) -> None:
    """Dynamic int8 quantization for CPU inference (`--quantize int8`), in place: every linear
    layer, the pre-softmax projection included, keeps int8 weights (one scale per output row) and
    quantizes its input per call (torch.ao dynamic quantization, fbgemm/x86 kernels); a ReLU
    feed-forward's max(0, .) runs inside its first product (`FusedFeedForward`). The
    embeddings stay float32. The model can no longer be trained or saved as a checkpoint. On the
    CPU in float32 only; a PyTorch that cannot quantize here is a one-line error."""
    if device.type != "cpu" or dtype != torch.float32:
        raise NmtError(f"--quantize int8 runs on the CPU in fp32 (add --device cpu), not on {device.type} "
                       f"in {str(dtype).removeprefix('torch.')}")
    try:
        from torch.ao.nn.intrinsic import LinearReLU
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        for module in list(model.modules()):
            for name, child in module.named_children():
                if type(child) is PositionwiseFeedForward and child.activation is F.relu:
                    setattr(module, name, FusedFeedForward(child))
        with warnings.catch_warnings():  # torch >= 2.10 warns that torch.ao moves to torchao
            warnings.simplefilter("ignore")
            quantize_dynamic(model.eval(), {nn.Linear: per_channel_dynamic_qconfig,
                                            LinearReLU: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True)
    except (ImportError, RuntimeError) as e:
        raise NmtError(f"--quantize int8: this PyTorch cannot quantize on this CPU ({e})") from None
