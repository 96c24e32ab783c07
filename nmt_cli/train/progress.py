"""Where a training run stands (`Progress`, saved in every checkpoint: updates, epoch, time,
best validation results, skipped batches) and why it stops (`Stop`)."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

from nmt_cli.config import TrainConfig

BETTER = {"nll": min, "bleu": max, "chrf": max, "ter": min}  # the better of two validation results


class Stop(enum.Enum):
    """Why a training run stops."""

    MAX_UPDATES = enum.auto()
    MAX_EPOCHS = enum.auto()
    MAX_TIME = enum.auto()
    PATIENCE = enum.auto()
    INTERRUPTED = enum.auto()

    def describe(self, c: TrainConfig, signals: Sequence[int] = ()) -> str:
        if self is Stop.MAX_UPDATES:
            return f"reached --max-updates {c.max_updates}"
        if self is Stop.MAX_EPOCHS:
            return f"reached --max-epochs {c.max_epochs}"
        if self is Stop.MAX_TIME:
            return f"reached --max-time {c.max_time:g} minutes"
        if self is Stop.PATIENCE:
            return f"no better validation {c.best_checkpoint_metric} in {c.patience} validations (--patience)"
        return f"interrupted by signal {signals[0] if signals else ''}".strip()


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint."""

    updates: int = 0
    epoch: int = 1
    epoch_updates: int = 0
    elapsed_s: float = 0.0
    best_valid_nll: float = math.inf
    best_valid_bleu: float = -1.0
    best_valid_chrf: float = -1.0
    best_valid_ter: float = math.inf
    bleu_signature: str = ""  # sacreBLEU's, of the --eval-bleu scores
    bad_validations: int = 0
    nonfinite_skips: int = 0
    oom_skips: int = 0

    def done(self, c: TrainConfig) -> Stop | None:
        """Why training should stop now, if it should (the criteria that need no clock or signal)."""
        if c.max_updates is not None and self.updates >= c.max_updates:
            return Stop.MAX_UPDATES
        if c.max_epochs is not None and self.epoch > c.max_epochs:
            return Stop.MAX_EPOCHS
        if c.patience is not None and self.bad_validations >= c.patience:
            return Stop.PATIENCE
        return None

    def finished(self, c: TrainConfig) -> str | None:
        """Why a run that starts from here has nothing to do, if it has not."""
        if c.max_time is not None and self.elapsed_s >= c.max_time * 60:  # the same on every process
            return f"{self.elapsed_s / 60:.1f} minutes trained already (--max-time {c.max_time:g})"
        stop = self.done(c)
        return stop.describe(c) if stop is not None else None

    def validated(self, result: dict[str, float], metric: str) -> bool:
        """Take a validation's result; returns whether it is the best so far by `metric`."""
        key = "nll" if metric == "ppl" else metric
        so_far = getattr(self, f"best_valid_{key}")
        best = BETTER[key](so_far, result[key]) != so_far  # strictly better
        for name, better in BETTER.items():
            if name in result:
                setattr(self, f"best_valid_{name}", better(getattr(self, f"best_valid_{name}"), result[name]))
        self.bad_validations = 0 if best else self.bad_validations + 1
        return best
