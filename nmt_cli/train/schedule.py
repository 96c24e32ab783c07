"""The learning rate of update `step`: eq. 3 of §5.3 (noam), fairseq's inverse square root, and
a linear decay to 0 at the end of the budget. The step may be a device tensor (the count of
updates applied so far, which the host has not read): the rate is then one too, and Adam takes
it without the host waiting.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nmt_cli.config import TrainConfig


def learning_rate(step: float | Tensor, d_model: int, config: TrainConfig, time_spent: float = 0.0) -> float | Tensor:
    """Rate for update `step` (1-based; a tensor: the device's count, which the host need not
    wait for); `time_spent` is the share of --max-time already trained.

    noam, eq. 3: lr_scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).
    inverse-sqrt: lr * step / warmup during warmup, then lr * sqrt(warmup / step).
    linear: lr * min(step / warmup, 1 - spent), where spent is the larger share of the budget
    trained before this update, in updates ((step - 1) / max_updates) or in time: a rate that
    falls to 0 as training ends.
    """
    if config.lr_schedule == "noam":
        return config.lr_scale * d_model ** -0.5 * lesser(step ** -0.5, step * config.warmup ** -1.5)
    if config.lr_schedule == "linear":
        spent = greater((step - 1) / config.max_updates if config.max_updates else 0.0, time_spent)
        return config.lr * greater(lesser(step / config.warmup, 1.0 - spent), 0.0)
    return config.lr * lesser(step / config.warmup, (config.warmup / step) ** 0.5)


def lesser(a: float | Tensor, b: float | Tensor) -> float | Tensor:
    """min(a, b) of numbers, or of tensors (without a host wait) where either is one."""
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return torch.minimum(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64))
    return min(a, b)


def greater(a: float | Tensor, b: float | Tensor) -> float | Tensor:
    return -lesser(-a, -b)
