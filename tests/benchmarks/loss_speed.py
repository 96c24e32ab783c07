"""The label-smoothed loss, forward + backward, by each way nmt can compute it:
`python tests/benchmarks/loss_speed.py [--device cuda]`.

Over logits (`--tokens`, `--vocab`) in `--dtype` (a training batch's: 25,000 target tokens and
base's 37,000-type vocabulary by default), times the definition as torch runs it (F.cross_entropy
with label_smoothing over the logits in float32, what autocast runs), kernels.SmoothedCrossEntropy
(blocks of rows) and, on a CUDA GPU with Triton, triton_kernels.FusedSmoothedCrossEntropy. One JSON
line per way and round: milliseconds per call, the logits' bytes moved per second at that speed as
if read once, and the largest difference of its loss and gradient from the definition's.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt_cli.device import tune
from nmt_cli.model import kernels
from nmt_cli.text.vocab import PAD_ID

EPSILON = 0.1
Loss = Callable[[Tensor, Tensor], Tensor]


def definition(logits: Tensor, target: Tensor) -> Tensor:
    """The sum over real tokens of (1 - eps) NLL + eps mean(-log p), as torch's own loss gives it."""
    return F.cross_entropy(logits.float(), target, ignore_index=PAD_ID, label_smoothing=EPSILON, reduction="sum")


def ways(device: torch.device) -> dict[str, Loss]:
    found = {"definition": definition,
             "blocks": lambda logits, target: kernels.SmoothedCrossEntropy.apply(logits, target, EPSILON)[0].sum()}
    fused = kernels.fused_loss(device)
    if fused is not None:
        found["fused"] = lambda logits, target: fused.apply(logits, target, EPSILON)[0].sum()
    return found


def run(loss: Loss, logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    x = logits.detach().requires_grad_()
    value = loss(x, target)
    value.backward()
    return value.detach(), x.grad


def timed(loss: Loss, logits: Tensor, target: Tensor, repeat: int) -> float:
    """Milliseconds per forward + backward, after a first run (where a Triton kernel compiles)."""
    sync = torch.cuda.synchronize if logits.is_cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(repeat):
        run(loss, logits, target)
    sync()
    return (time.perf_counter() - start) / repeat * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--tokens", type=int, default=25_000)
    parser.add_argument("--vocab", type=int, default=37_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    device = torch.device(args.device)
    tune(device, args.threads)
    torch.manual_seed(0)
    logits = (torch.randn(args.tokens, args.vocab, device=device) * 3).to(getattr(torch, args.dtype))
    target = torch.randint(4, args.vocab, (args.tokens,), device=device)
    target[::10] = PAD_ID
    reference = run(definition, logits, target)
    for name, loss in ways(device).items():
        value, grad = run(loss, logits, target)  # also the warm-up
        for _ in range(args.rounds):
            ms = timed(loss, logits, target, args.repeat)
            print(json.dumps({
                "benchmark": "loss_speed", "way": name, "device": str(device), "dtype": args.dtype,
                "tokens": args.tokens, "vocab": args.vocab, "ms": round(ms, 3),
                "logits_gb_per_s": round(logits.numel() * logits.element_size() / ms / 1e6, 1),
                "loss_rel_diff": float(abs(value - reference[0]) / abs(reference[0])),
                "grad_max_diff": float((grad.float() - reference[1].float()).abs().max()),
            }), flush=True)


if __name__ == "__main__":
    main()
