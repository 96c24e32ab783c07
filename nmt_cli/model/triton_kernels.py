"""Fast paths written in Triton, for CUDA GPUs: each a drop-in replacement for one of kernels.py's
plain-torch paths, chosen there (`kernels.smoothed_cross_entropy`), and tested equal to it on the CPU
through Triton's interpreter (tests/model/test_kernels.py) and on a GPU as compiled.

- `FusedSmoothedCrossEntropy`: the label-smoothed loss in one read of the logits forward and one
  read and one write backward, where the blocked torch version makes about a dozen float32 passes.

Importing this module needs Triton (it comes with PyTorch's CUDA builds for Linux).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from nmt_cli.text.vocab import PAD_ID


@triton.jit
def _loss_forward(logits, target, normalizer, loss, nll, vocab, epsilon, pad_id, BLOCK: tl.constexpr):
    """One row's log-normalizer, label-smoothed loss and NLL, reading its logits once: the
    maximum and the sum of exponentials are carried along the row as they grow (online softmax),
    with the sum of the logits for the smoothing's mean."""
    row = tl.program_id(0).to(tl.int64)
    start = logits + row * vocab
    maximum = tl.full([], float("-inf"), tl.float32)
    exp_sum = tl.zeros([], tl.float32)
    logit_sum = tl.zeros([], tl.float32)
    for first in range(0, vocab, BLOCK):
        columns = first + tl.arange(0, BLOCK)
        inside = columns < vocab
        x = tl.load(start + columns, mask=inside, other=float("-inf")).to(tl.float32)
        new_maximum = tl.maximum(maximum, tl.max(x, 0))
        exp_sum = exp_sum * tl.exp(maximum - new_maximum) + tl.sum(tl.exp(x - new_maximum), 0)
        logit_sum += tl.sum(tl.where(inside, x, 0.0), 0)
        maximum = new_maximum
    log_normalizer = maximum + tl.log(exp_sum)
    token = tl.load(target + row)
    real = token != pad_id
    token_nll = tl.where(real, log_normalizer - tl.load(start + token).to(tl.float32), 0.0)
    uniform = tl.where(real, log_normalizer - logit_sum / vocab, 0.0)
    tl.store(normalizer + row, log_normalizer)
    tl.store(nll + row, token_nll)
    tl.store(loss + row, (1 - epsilon) * token_nll + epsilon * uniform)


@triton.jit
def _loss_backward(logits, grad, target, normalizer, weight, vocab, epsilon, pad_id,
                   BLOCK: tl.constexpr):
    """One row's gradient, weight * (softmax - (1 - eps) * onehot(target) - eps / V), written once
    in the logits' precision; zero for padding."""
    row = tl.program_id(0).to(tl.int64)
    start, out = logits + row * vocab, grad + row * vocab
    token = tl.load(target + row)
    log_normalizer = tl.load(normalizer + row)
    scale = tl.where(token != pad_id, tl.load(weight + row), 0.0)
    for first in range(0, vocab, BLOCK):
        columns = first + tl.arange(0, BLOCK)
        inside = columns < vocab
        x = tl.load(start + columns, mask=inside, other=0.0).to(tl.float32)
        g = tl.exp(x - log_normalizer) - epsilon / vocab - tl.where(columns == token, 1 - epsilon, 0.0)
        tl.store(out + columns, (g * scale).to(out.dtype.element_ty), mask=inside)


class FusedSmoothedCrossEntropy(torch.autograd.Function):
    """kernels.SmoothedCrossEntropy's per-token loss and NLL, and its gradient, as two Triton
    kernels of one program per row (of contiguous logits). Rows of up to `BLOCK` logits are read in one piece; longer
    ones in pieces of `BLOCK`."""

    BLOCK = 8192
    WARPS = 8

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
        logits, target = logits.contiguous(), target.contiguous()
        rows, vocab = logits.shape
        normalizer = logits.new_empty(rows, dtype=torch.float32)
        loss, nll = torch.empty_like(normalizer), torch.empty_like(normalizer)
        block = min(FusedSmoothedCrossEntropy.BLOCK, triton.next_power_of_2(vocab))
        _loss_forward[(rows,)](logits, target, normalizer, loss, nll, vocab, epsilon, PAD_ID,
                               BLOCK=block, num_warps=FusedSmoothedCrossEntropy.WARPS)
        ctx.save_for_backward(logits, target, normalizer)
        ctx.epsilon, ctx.block = epsilon, block
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor, None, None]:
        logits, target, normalizer = ctx.saved_tensors
        grad = torch.empty_like(logits)
        rows, vocab = logits.shape
        _loss_backward[(rows,)](logits, grad, target, normalizer, grad_loss.float().contiguous(), vocab, ctx.epsilon,
                                PAD_ID, BLOCK=ctx.block, num_warps=FusedSmoothedCrossEntropy.WARPS)
        return grad, None, None

