"""Binarized, memory-mapped data and token-based batching (§5.1).

A split of one language is two files: `NAME.bin`, every sentence's token ids back to back
(uint16, or int32 for vocabularies over 65,535), and `NAME.idx`, the int64 offsets of the
sentences (n + 1 of them). Reading maps the files, so a corpus larger than memory trains.
Sentences are stored without EOS; `ParallelData` adds EOS (source, target) and BOS (decoder input).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from nmt_cli.text.vocab import BOS_ID, EOS_ID, PAD_ID

if TYPE_CHECKING:
    import torch


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.int32)


class ArrayWriter:
    """Appends sentences to `PREFIX.bin` / `PREFIX.idx` as they come (constant memory)."""

    def __init__(self, prefix: Path, dtype: np.dtype) -> None:
        self.dtype = dtype
        self.bin = open(f"{prefix}.bin", "wb")
        self.idx = open(f"{prefix}.idx", "wb")
        self.offset = 0
        self.idx.write(np.zeros(1, dtype=np.int64).tobytes())

    def add(self, ids: Sequence[int]) -> None:
        self.extend(np.asarray(ids, dtype=self.dtype), np.array([len(ids)]))

    def extend(self, ids: np.ndarray, lengths: np.ndarray) -> None:
        """Append several sentences at once: `ids` back to back, `lengths` of each."""
        self.bin.write(ids.astype(self.dtype, copy=False).tobytes())
        offsets = self.offset + np.cumsum(lengths, dtype=np.int64)
        self.idx.write(offsets.tobytes())
        if len(offsets):
            self.offset = int(offsets[-1])

    def close(self) -> None:
        self.bin.close()
        self.idx.close()


class IndexedArray:
    """Read-only, memory-mapped view of a `PREFIX.bin` / `PREFIX.idx` pair."""

    def __init__(self, prefix: Path, dtype: np.dtype) -> None:
        self.offsets = np.fromfile(f"{prefix}.idx", dtype=np.int64)
        size = self.offsets[-1] if len(self.offsets) else 0
        if len(self.offsets) == 0 or Path(f"{prefix}.bin").stat().st_size != size * dtype.itemsize:
            raise ValueError(f"{prefix}.bin/.idx: sizes do not match (corrupt or truncated data)")
        self.data = np.memmap(f"{prefix}.bin", dtype=dtype, mode="r", shape=(size,)) if size else np.zeros(0, dtype)
        self.lengths = np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        return self.data[self.offsets[i] : self.offsets[i + 1]]


class ParallelData:
    """Aligned source and target arrays of one split; lengths include the EOS the model sees."""

    def __init__(self, source: IndexedArray, target: IndexedArray) -> None:
        if len(source) != len(target):
            raise ValueError(f"source has {len(source)} sentences, target {len(target)}")
        self.source, self.target = source, target
        self.src_lengths = source.lengths + 1
        self.tgt_lengths = target.lengths + 1

    @classmethod
    def load(cls, data_dir: Path, split: str, src_lang: str, tgt_lang: str, dtype: np.dtype) -> ParallelData:
        return cls(IndexedArray(data_dir / f"{split}.{src_lang}", dtype),
                   IndexedArray(data_dir / f"{split}.{tgt_lang}", dtype))

    def __len__(self) -> int:
        return len(self.source)

    def collate(self, indices: Sequence[int], pad_to_multiple: int = 1, buckets: np.ndarray | None = None) -> Batch:
        """Right-padded source (+EOS), decoder input (BOS+) and output (+EOS) for `indices`; with
        `buckets` (length_buckets), all three padded to the bucket length of the batch's longest side."""
        length = None
        if buckets is not None:
            longest = max(int(self.src_lengths[indices].max()), int(self.tgt_lengths[indices].max()))
            length = int(padded_length(longest, 1, buckets))
        return Batch.make([self.source[i] for i in indices], [self.target[i] for i in indices],
                          pad_to_multiple, length)


class Batch:
    """Tensors for one step of training or validation."""

    def __init__(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor) -> None:
        self.src, self.tgt_in, self.tgt_out = src, tgt_in, tgt_out

    @classmethod
    def make(cls, sources: Sequence[np.ndarray], targets: Sequence[np.ndarray], pad_to_multiple: int = 1,
             length: int | None = None) -> Batch:
        src = pad(sources, pad_to_multiple, last=EOS_ID, length=length)
        tgt_in = pad(targets, pad_to_multiple, first=BOS_ID, length=length)
        tgt_out = pad(targets, pad_to_multiple, last=EOS_ID, length=length)
        return cls(src, tgt_in, tgt_out)

    def pin_memory(self) -> Batch:
        """Page-locked copies, so that the copies to a GPU run asynchronously."""
        return Batch(*(t.pin_memory() for t in (self.src, self.tgt_in, self.tgt_out)))

    def to(self, device: torch.device | str) -> Batch:
        return Batch(*(t.to(device, non_blocking=True) for t in (self.src, self.tgt_in, self.tgt_out)))

    @property
    def target_tokens(self) -> int:
        return int((self.tgt_out != PAD_ID).sum())


def pad(sequences: Sequence[np.ndarray], multiple: int = 1, first: int | None = None,
        last: int | None = None, value: int = PAD_ID, length: int | None = None) -> torch.Tensor:
    """(batch, longest) int64 tensor of the sequences, each with `first` before it and `last` after
    it when given, right-padded with `value` to a multiple of `multiple`, or to `length` when given."""
    import torch  # here, not at the top: `nmt preprocess` writes this module's files without loading torch
    lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
    start = int(first is not None)
    full = lengths + start + int(last is not None)
    longest = int(padded_length(full.max(), multiple)) if length is None else length
    assert longest >= full.max(), f"padding to {longest} cuts a sequence of {full.max()}"
    out = np.full((len(sequences), longest), value, dtype=np.int64)
    if first is not None:
        out[:, 0] = first
    body = out[:, start:]
    body[np.arange(body.shape[1]) < lengths[:, None]] = np.concatenate(sequences)
    if last is not None:
        out[np.arange(len(sequences)), lengths + start] = last
    return torch.from_numpy(out)


class Prefetcher:
    """With `background` (for a GPU), collates the micro-batches of the next update on a thread,
    into page-locked memory where CUDA is there, while the current update runs, so the GPU does
    not wait for the host. Without it (a CPU, whose cores the update uses), batches are collated
    when asked for."""

    def __init__(self, data: ParallelData, pad_to_multiple: int, background: bool,
                 buckets: np.ndarray | None = None) -> None:
        from concurrent.futures import ThreadPoolExecutor

        import torch

        self.data, self.pad_to_multiple, self.background, self.buckets = data, pad_to_multiple, background, buckets
        self.pin = background and torch.cuda.is_available()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="nmt-collate") if background else None
        self.pending: tuple[list[np.ndarray], Future] | None = None

    def collate(self, batches: list[np.ndarray]) -> list[Batch]:
        collated = [self.data.collate(indices, self.pad_to_multiple, self.buckets) for indices in batches]
        return [b.pin_memory() for b in collated] if self.pin else collated

    def prefetch(self, batches: list[np.ndarray]) -> None:
        """Start collating `batches` (the next update's) in the background."""
        if self.pool is not None:
            self.pending = (batches, self.pool.submit(self.collate, batches))

    def get(self, batches: list[np.ndarray]) -> list[Batch]:
        """The collated `batches`: the prefetched ones when they are these, else collated now."""
        pending, self.pending = self.pending, None
        if pending is not None and len(pending[0]) == len(batches) and all(
                a is b for a, b in zip(pending[0], batches)):
            return pending[1].result()
        return self.collate(batches)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


def padded_length(length: np.ndarray | int, multiple: int = 1, buckets: np.ndarray | None = None) -> np.ndarray:
    """What a sequence of `length` (elementwise) is padded to: the next multiple of `multiple`, or
    with `buckets` the smallest bucket length that holds it."""
    if buckets is not None:
        return buckets[np.searchsorted(buckets, length)]
    return -(-np.asarray(length) // multiple) * multiple


def length_buckets(src_lengths: np.ndarray, tgt_lengths: np.ndarray, count: int, multiple: int = 1) -> np.ndarray:
    """At most `count` lengths, multiples of `multiple`, that batches are padded to (both sides),
    so that a compiled or captured update sees few shapes. They minimize the padded tokens (the
    sum over pairs of the bucket length of their longer side), by dynamic programming over the
    lengths that occur; the last is the longest pair's."""
    longest = np.maximum(src_lengths, tgt_lengths)
    values, counts = np.unique(padded_length(longest, multiple), return_counts=True)
    if len(values) <= count:
        return values
    upto = np.cumsum(counts).astype(np.float64)  # pairs at or under each value
    later = np.triu(np.ones((len(values), len(values)), dtype=bool), k=1)  # i < j
    total = values * upto  # least padded tokens of the pairs up to values[j], one bucket ending there
    parents = []
    for _ in range(count - 1):  # one more bucket: the last at values[j] after one at values[i]
        extended = np.where(later, total[:, None] + values[None, :] * (upto[None, :] - upto[:, None]), np.inf)
        parents.append(extended.argmin(axis=0))
        total = extended.min(axis=0)
    j, chosen = len(values) - 1, [len(values) - 1]
    for parent in reversed(parents):
        j = int(parent[j])
        chosen.append(j)
    return values[chosen[::-1]]


def token_batches(src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int,
                  max_sentences: int | None = None, pad_to_multiple: int = 1,
                  buckets: np.ndarray | None = None) -> list[np.ndarray]:
    """Group sentence indices into batches of similar length (§5.1).

    A batch's cost is its size times its longest side, padding included, as fairseq counts it:
    batch_size * max(max src length, max tgt length) <= max_tokens. Sentences are sorted by
    (target, source) length so batches have little padding. With `buckets` (length_buckets), a
    pair's longest side is its bucket's length and a batch holds pairs of one bucket: each bucket
    gives full batches of one size and at most one smaller one, so at most 2 x len(buckets)
    shapes. A pair longer than max_tokens alone raises ValueError: it could never be trained on.
    """
    longest = np.maximum(src_lengths, tgt_lengths)
    if len(longest) and longest.max() > max_tokens:
        i = int(longest.argmax())
        raise ValueError(f"sentence pair {i + 1} has {int(longest[i])} tokens, more than max_tokens={max_tokens}")
    widths = padded_length(longest, pad_to_multiple, buckets)
    order = np.lexsort((src_lengths, tgt_lengths) if buckets is None else (src_lengths, tgt_lengths, widths))
    batches, start, width = [], 0, 0
    for position, i in enumerate(order):
        padded = int(widths[i])
        new_width = max(width, padded)
        size = position - start + 1
        if size > 1 and (new_width * size > max_tokens or (max_sentences and size > max_sentences)
                         or (buckets is not None and padded != width)):
            batches.append(order[start:position])
            start, new_width = position, padded
        width = new_width
    if start < len(order):
        batches.append(order[start:])
    return batches


def shapes_and_padding(data: ParallelData, batches: list[np.ndarray], pad_to_multiple: int = 1,
                       buckets: np.ndarray | None = None) -> tuple[int, float]:
    """The distinct (rows, source length, target length) shapes of `batches` as `collate` pads
    them, and the share of their positions that are padding."""
    shapes, positions, real = set(), 0, 0
    for indices in batches:
        src, tgt = data.src_lengths[indices], data.tgt_lengths[indices]
        if buckets is None:
            sides = (int(padded_length(src.max(), pad_to_multiple)), int(padded_length(tgt.max(), pad_to_multiple)))
        else:
            sides = (int(padded_length(max(src.max(), tgt.max()), 1, buckets)),) * 2
        shapes.add((len(indices), *sides))
        positions += len(indices) * sum(sides)
        real += int(src.sum() + tgt.sum())
    return len(shapes), 1 - real / max(positions, 1)


def shuffled(batches: list[np.ndarray], seed: int, epoch: int) -> list[np.ndarray]:
    """The epoch's batch order: a permutation drawn from (seed, epoch) alone, so resume can redo it."""
    rng = np.random.default_rng([seed, epoch])
    return [batches[i] for i in rng.permutation(len(batches))]

