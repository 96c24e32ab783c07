"""The batches of an epoch, and which of them each update and each process takes.

The batches of an epoch are a seeded permutation of length-grouped token batches (data.py);
with W processes and K micro-batches per update, update u of an epoch takes batches
[u*W*K, (u+1)*W*K) and process r the K of them starting at u*W*K + r*K. Only the product W*K
shapes the updates, so a run may resume on another number of processes with the --update-freq
that keeps it. An epoch's last update may be short: processes without a share of it take part
with weight 0 (Trainer.update).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nmt_cli.config import TrainConfig
from nmt_cli.corpus.data import ParallelData, length_buckets, shuffled, token_batches
from nmt_cli.corpus.datadir import DataDir
from nmt_cli.errors import NmtError
from nmt_cli.train.runtime import Runtime


def check_lengths(data_dir: Path, trains: list[ParallelData], valid: ParallelData | None, max_positions: int) -> None:
    """Refuse data with a sequence longer than the model's positions, naming the valid pair."""
    longest = max(int(max(train.src_lengths.max(), train.tgt_lengths.max())) for train in trains)
    if longest > max_positions:
        raise NmtError(f"{data_dir}: training has a sequence of {longest} tokens (EOS included), more than "
                       f"--max-positions {max_positions}; raise it or preprocess with a smaller --max-len")
    lengths = np.maximum(valid.src_lengths, valid.tgt_lengths) if valid is not None else np.zeros(0)
    if lengths.max(initial=0) > max_positions:
        raise NmtError(f"{data_dir}: valid pair {int(lengths.argmax()) + 1} has {int(lengths.max())} tokens (EOS "
                       f"included), more than --max-positions {max_positions}; shorten or remove that line of "
                       "the valid split, or raise --max-positions")


def make_batches(data_dir: Path, config: TrainConfig, train: ParallelData, valid: ParallelData | None,
                 pad_multiple: int, buckets: np.ndarray | None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Training batches of --max-tokens (of the length buckets, with --length-buckets), and valid
    batches that each hold at least the longest valid pair (validation never drops one)."""
    try:
        batches = token_batches(train.src_lengths, train.tgt_lengths, config.max_tokens, config.max_sentences,
                                pad_multiple, buckets)
    except ValueError as e:
        raise NmtError(f"{data_dir}: {e}; raise --max-tokens") from None
    if valid is None:
        return batches, []
    longest = int(max(valid.src_lengths.max(initial=1), valid.tgt_lengths.max(initial=1)))
    return batches, token_batches(valid.src_lengths, valid.tgt_lengths, max(config.max_tokens, longest))


def load_splits(data: DataDir, config: TrainConfig, pad_multiple: int, max_positions: int) -> tuple[
        ParallelData, ParallelData | None, list[np.ndarray], list[np.ndarray], list[tuple[ParallelData, list]],
        np.ndarray | None]:
    """The training split, the valid split, their batches, the training split's sampled
    segmentations with theirs (subword regularization), and the length buckets of all training
    batches (--length-buckets); data longer than the model's positions is refused."""
    train = data.split("train")
    valid = data.split("valid") if data.has_split("valid") else None
    sampled = [data.split(name) for name in data.sampled_splits]
    check_lengths(data.path, [train, *sampled], valid, max_positions)
    buckets = length_buckets(np.concatenate([split.src_lengths for split in (train, *sampled)]),
                             np.concatenate([split.tgt_lengths for split in (train, *sampled)]),
                             config.length_buckets, pad_multiple) if config.length_buckets else None
    batches, valid_batches = make_batches(data.path, config, train, valid, pad_multiple, buckets)
    samples = [(sample, make_batches(data.path, config, sample, None, pad_multiple, buckets)[0])
               for sample in sampled]
    return train, valid, batches, valid_batches, samples, buckets


@dataclass(frozen=True)
class Update:
    """One update of an epoch: its batches on all processes, this process's share (a stand-in
    batch where it has none: not `counted`), and the target tokens of all of them."""

    group: list[np.ndarray]
    mine: list[np.ndarray]
    counted: bool
    tokens: int


class EpochPlan:
    """Which batches update u of epoch e takes, on every process and on this one: the training
    split, or in turn each of its sampled segmentations (subword regularization), their batches
    in each epoch's seeded order, and this process's share."""

    def __init__(self, train: ParallelData, batches: list[np.ndarray], samples: list[tuple[ParallelData, list]],
                 seed: int, runtime: Runtime, update_freq: int) -> None:
        self.train, self.batches, self.samples, self.seed = train, batches, samples, seed
        self.runtime, self.update_freq = runtime, update_freq
        self._order: tuple[int, list[np.ndarray]] | None = None  # the last epoch's order, reused
        self._last: tuple[tuple[int, int], Update] | None = None  # the last update made (the loop prefetches it)

    def split(self, epoch: int) -> tuple[ParallelData, list[np.ndarray]]:
        """The segmentation that epoch `epoch` (1-based) trains on, and its batches."""
        return self.samples[(epoch - 1) % len(self.samples)] if self.samples else (self.train, self.batches)

    def updates(self, epoch: int) -> int:
        """An epoch's updates: every batch is trained, the last update taking what is left."""
        return -(-len(self.split(epoch)[1]) // (self.runtime.world * self.update_freq))

    def update(self, epoch: int, u: int) -> Update:
        """Update `u` (0-based) of epoch `epoch`: its batches on all processes and this one's."""
        if self._last is not None and self._last[0] == (epoch, u):
            return self._last[1]
        if self._order is None or self._order[0] != epoch:
            self._order = epoch, shuffled(self.split(epoch)[1], self.seed, epoch)
        size, rank = self.runtime.world * self.update_freq, self.runtime.rank
        group = self._order[1][u * size:(u + 1) * size]
        mine = group[rank * self.update_freq:(rank + 1) * self.update_freq]
        tokens = int(sum(self.split(epoch)[0].tgt_lengths[b].sum() for b in group))
        self._last = (epoch, u), Update(group, mine or group[:1], bool(mine), tokens)
        return self._last[1]


def same_updates(saved: dict[str, Any], now: dict[str, Any]) -> bool:
    """Whether two runs' batching makes the same updates: what counts of processes and
    --update-freq is their product (4 processes = 1 process with --update-freq 4)."""
    def updates(batching: dict[str, Any]) -> dict[str, Any]:
        rest = {k: v for k, v in batching.items() if k not in ("world", "update_freq")}
        return {**rest, "batches_per_update": batching.get("world", 1) * batching.get("update_freq", 1)}
    return updates(saved) == updates(now)
