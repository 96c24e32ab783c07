"""Binarized arrays, token batching and length buckets."""

import itertools

import numpy as np
import pytest
import torch

from nmt_cli.corpus.data import (
    ArrayWriter,
    IndexedArray,
    ParallelData,
    Prefetcher,
    length_buckets,
    pad,
    shapes_and_padding,
    shuffled,
    token_batches,
    token_dtype,
)
from nmt_cli.text.vocab import BOS_ID, EOS_ID, PAD_ID


def write_array(prefix, sentences, dtype=np.dtype(np.uint16)):
    writer = ArrayWriter(prefix, dtype)
    for s in sentences:
        writer.add(s)
    writer.close()
    return IndexedArray(prefix, dtype)


def test_indexed_array_round_trip_with_empty_sentences(tmp_path):
    sentences = [[5, 6, 7], [], [8], [9, 10]]
    array = write_array(tmp_path / "x", sentences)
    assert [list(array[i]) for i in range(len(array))] == sentences
    assert list(array.lengths) == [3, 0, 1, 2]


def test_extend_appends_packed_chunks_like_add(tmp_path):
    writer = ArrayWriter(tmp_path / "x", np.dtype(np.uint16))
    writer.extend(np.array([5, 6, 7, 8], dtype=np.int64), np.array([3, 0, 1]))
    writer.extend(np.array([], dtype=np.int64), np.array([], dtype=np.int64))
    writer.add([9, 10])
    writer.extend(np.array([11]), np.array([1]))
    writer.close()
    array = IndexedArray(tmp_path / "x", np.dtype(np.uint16))
    assert [list(array[i]) for i in range(len(array))] == [[5, 6, 7], [], [8], [9, 10], [11]]


def test_truncated_array_is_detected(tmp_path):
    write_array(tmp_path / "x", [[5, 6, 7], [8]])
    with open(tmp_path / "x.bin", "r+b") as f:
        f.truncate(4)
    with pytest.raises(ValueError, match="corrupt or truncated"):
        IndexedArray(tmp_path / "x", np.dtype(np.uint16))


def test_dtype_follows_vocabulary_size():
    assert token_dtype(65536) == np.uint16 and token_dtype(65537) == np.int32


def test_collate_adds_bos_eos_and_pads(tmp_path):
    src = write_array(tmp_path / "s", [[5, 6], [7]])
    tgt = write_array(tmp_path / "t", [[8], [9, 10, 11]])
    batch = ParallelData(src, tgt).collate([0, 1])
    assert batch.src.tolist() == [[5, 6, EOS_ID], [7, EOS_ID, PAD_ID]]
    assert batch.tgt_in.tolist() == [[BOS_ID, 8, PAD_ID, PAD_ID], [BOS_ID, 9, 10, 11]]
    assert batch.tgt_out.tolist() == [[8, EOS_ID, PAD_ID, PAD_ID], [9, 10, 11, EOS_ID]]
    assert batch.target_tokens == 6


def test_pad_to_multiple():
    assert pad([np.array([1, 2, 3])], multiple=8).shape == (1, 8)
    assert pad([np.array([4]), np.array([], dtype=np.int64)], first=BOS_ID, last=EOS_ID).tolist() == [
        [BOS_ID, 4, EOS_ID], [BOS_ID, EOS_ID, PAD_ID]]


@pytest.mark.parametrize("background", [False, True])
def test_prefetched_batches_are_the_batches_asked_for(tmp_path, background):
    rng = np.random.default_rng(0)
    sentences = [rng.integers(4, 50, rng.integers(0, 9)).tolist() for _ in range(40)]
    data = ParallelData(write_array(tmp_path / "s", sentences), write_array(tmp_path / "t", sentences[::-1]))
    prefetcher = Prefetcher(data, 8, background)
    groups = [[np.arange(i, i + 5), np.arange(i + 5, i + 10)] for i in range(0, 40, 10)]
    for i, group in enumerate(groups):
        if i + 1 < len(groups):
            prefetcher.prefetch(groups[i + 1])
        got = prefetcher.get(group)
        for batch, indices in zip(got, group, strict=True):
            expected = data.collate(indices, 8)
            assert all(torch.equal(a, b) for a, b in zip((batch.src, batch.tgt_in, batch.tgt_out),
                                                         (expected.src, expected.tgt_in, expected.tgt_out)))
    prefetcher.prefetch(groups[0])  # a prefetch that is not what is asked for next is not used
    (batch,) = prefetcher.get([groups[1][0]])
    assert torch.equal(batch.src, data.collate(groups[1][0], 8).src)
    prefetcher.close()


@pytest.mark.parametrize("max_tokens,multiple", [(64, 1), (100, 1), (256, 8), (37, 1)])
def test_token_batches_respect_max_tokens_and_cover_each_pair_once(max_tokens, multiple):
    rng = np.random.default_rng(0)
    src = rng.integers(1, 30, 500)
    tgt = rng.integers(1, 36, 500)
    batches = token_batches(src, tgt, max_tokens, pad_to_multiple=multiple)
    for batch in batches:
        width = max(src[batch].max(), tgt[batch].max())
        width = -(-width // multiple) * multiple
        assert len(batch) * width <= max_tokens or len(batch) == 1
    assert sorted(np.concatenate(batches).tolist()) == list(range(500))
    # Batches are full: the first pair of the next batch would not have fitted.
    longest = np.maximum(src, tgt)
    for batch, following in zip(batches, batches[1:]):
        width = -(-max(longest[batch].max(), longest[following[0]]) // multiple) * multiple
        assert (len(batch) + 1) * width > max_tokens


def test_token_batches_max_sentences():
    batches = token_batches(np.full(10, 2), np.full(10, 2), 1000, max_sentences=3)
    assert [len(b) for b in batches] == [3, 3, 3, 1]


def test_pair_longer_than_max_tokens_is_an_error():
    with pytest.raises(ValueError, match="sentence pair 2 has 50 tokens"):
        token_batches(np.array([3, 50]), np.array([3, 4]), 40)


def test_shuffle_depends_on_seed_and_epoch_only():
    batches = [np.array([i]) for i in range(20)]
    order = [int(b[0]) for b in shuffled(batches, 1, 3)]
    assert order == [int(b[0]) for b in shuffled(batches, 1, 3)]
    assert order != [int(b[0]) for b in shuffled(batches, 1, 4)]
    assert sorted(order) == list(range(20))


def test_batch_tensors_are_int64():
    assert pad([np.array([1], dtype=np.uint16)]).dtype == torch.int64


# ------------------------------------------------------------------ length buckets (static shapes)

def test_length_buckets_are_the_least_padding_choice():
    """Against every choice of 3 lengths among those that occur (the longest always one of them)."""
    rng = np.random.default_rng(3)
    src = rng.integers(1, 30, 500)
    tgt = np.clip(src + rng.integers(-4, 5, 500), 1, None)
    longest = np.maximum(src, tgt)

    def padded(lengths):
        return int(np.asarray(lengths)[np.searchsorted(lengths, longest)].sum())

    values = np.unique(longest)
    brute = min(padded(list(rest) + [values[-1]]) for rest in itertools.combinations(values[:-1], 2))
    buckets = length_buckets(src, tgt, 3)
    assert len(buckets) == 3 and buckets[-1] == longest.max() and padded(buckets) == brute
    assert longest.max() == 33
    assert list(length_buckets(src, tgt, 100, multiple=8)) == [8, 16, 24, 32, 40]  # fewer occur than asked
    two = length_buckets(src, tgt, 2, multiple=8)
    assert two[-1] == 40 and padded(two) == min(padded([b, 40]) for b in (8, 16, 24, 32))


def wmt_like_lengths(pairs: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Source ~ lognormal (median 25 tokens), target 0.8-1.25x it, EOS included, at most 200."""
    rng = np.random.default_rng(seed)
    src = np.clip(rng.lognormal(np.log(25), 0.5, pairs), 3, 199).astype(np.int64)
    return src + 1, np.clip(src * rng.uniform(0.8, 1.25, pairs), 3, 199).astype(np.int64) + 1


class Lengths:
    """A ParallelData's lengths alone, for shapes_and_padding."""

    def __init__(self, src: np.ndarray, tgt: np.ndarray) -> None:
        self.src_lengths, self.tgt_lengths = src, tgt


def test_length_buckets_give_an_epoch_of_few_shapes():
    """An epoch of 300,000 pairs of WMT-like lengths at 25,000 tokens, padded to multiples of 8:
    16 buckets give at most 32 (rows, length, length) shapes, every pair once, every batch within
    the token budget, with little more padding than batches padded to their own longest side."""
    src, tgt = wmt_like_lengths(300_000)
    buckets = length_buckets(src, tgt, 16, multiple=8)
    assert len(buckets) <= 16 and all(b % 8 == 0 for b in buckets) and buckets[-1] >= max(src.max(), tgt.max())
    batches = token_batches(src, tgt, 25_000, None, 8, buckets)
    assert sorted(np.concatenate(batches).tolist()) == list(range(300_000))
    widths = [int(buckets[np.searchsorted(buckets, max(src[b].max(), tgt[b].max()))]) for b in batches]
    assert all(len(b) * width <= 25_000 for b, width in zip(batches, widths))
    shapes, padding = shapes_and_padding(Lengths(src, tgt), batches, 8, buckets)
    assert shapes == len({(len(b), width) for b, width in zip(batches, widths)}) <= 2 * len(buckets)
    plain = token_batches(src, tgt, 25_000, None, 8)
    plain_shapes, plain_padding = shapes_and_padding(Lengths(src, tgt), plain, 8)
    assert plain_shapes > shapes and padding < plain_padding + 0.05


def test_bucketed_batches_are_collated_to_their_bucket_length(tmp_path):
    src = write_array(tmp_path / "s", [[5, 6], [7], [5] * 9])
    tgt = write_array(tmp_path / "t", [[8], [9, 10, 11], [8] * 4])
    data, buckets = ParallelData(src, tgt), np.array([5, 10])
    batch = data.collate([0, 1], buckets=buckets)
    assert batch.src.shape == batch.tgt_in.shape == batch.tgt_out.shape == (2, 5)
    assert batch.tgt_out.tolist()[1] == [9, 10, 11, EOS_ID, PAD_ID] and batch.target_tokens == 6
    assert data.collate([2], buckets=buckets).src.shape == (1, 10)
    prefetched = Prefetcher(data, 1, background=False, buckets=buckets).get([np.array([0, 1])])
    assert prefetched[0].src.shape == (2, 5)
