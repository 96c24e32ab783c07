"""The work of `nmt preprocess` in its worker processes, and the pool that runs it.

A stage's state (tokenizers, BPE, vocabularies) is built once in the parent, which then forks
the workers: they inherit it instead of rebuilding it. Each worker function takes a chunk of lines
or words and returns what the parent only has to append (bytes, counts, packed ids).
"""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import signal
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nmt_cli.config import TextConfig
from nmt_cli.text.processor import TextProcessor, subword_counts
from nmt_cli.text.vocab import UNK_ID, Vocabulary

# A training line with more characters than this times --max-len cannot fit in --max-len tokens in
# practice; it is dropped as too long without running the tokenizer over it (a 1 MB line, say).
MAX_CHARS_PER_TOKEN = 100

_worker: dict[str, Any] = {}
WARM_UP_LINE = 'A "warm-up" line: 1,000 words (and more) - it\'s here.'


def init_worker(text: TextConfig, src_vocab: list[str] | None = None, tgt_vocab: list[str] | None = None,
                dtype: np.dtype | None = None, segmenter: TextProcessor | None = None,
                word_counts: tuple[Counter, Counter] | None = None, sentencepiece: bytes | None = None,
                target_sentencepiece: bytes | None = None) -> None:
    """The state of a stage's workers, built in the parent and inherited by the forked workers.
    `segmenter`: the processor holding the BPE codes (and, in stage 4, every training word
    segmented already), whose BPE the workers share instead of each parsing the codes again;
    `sentencepiece`: the SentencePiece model, with which the workers' "words" are pieces
    (`target_sentencepiece`: the target side's own, if it has one)."""
    _worker.update(dtype=dtype, word_counts=word_counts)
    _worker["src"] = TextProcessor(text, text.source_lang, sentencepiece=sentencepiece)
    _worker["tgt"] = TextProcessor(text, text.target_lang, sentencepiece=target_sentencepiece or sentencepiece)
    if segmenter is not None:
        _worker["src"].bpe = _worker["tgt"].bpe = segmenter.bpe
    _worker["src_ids"] = WordIds(_worker["src"], Vocabulary(src_vocab)) if src_vocab is not None else None
    _worker["tgt_ids"] = WordIds(_worker["tgt"], Vocabulary(tgt_vocab)) if tgt_vocab is not None else None
    for processor in (_worker["src"], _worker["tgt"]):  # compile the tokenizer's regexes before forking
        processor.tokenize(WARM_UP_LINE)


class WordIds:
    """Words -> subword ids, each distinct word segmented and looked up once. Exact, because BPE
    segments every word on its own: a line's ids are its words' ids back to back."""

    def __init__(self, processor: TextProcessor, vocab: Vocabulary) -> None:
        self.processor, self.vocab = processor, vocab
        self.cache: dict[str, list[int]] = {}

    def encode(self, words: list[str]) -> list[int]:
        ids: list[int] = []
        cache = self.cache
        for word in words:
            word_ids = cache.get(word)
            if word_ids is None:
                word_ids = cache[word] = self.vocab.encode(self.processor.segment([word]))
            ids.extend(word_ids)
        return ids


@dataclass
class TokenizedChunk:
    """Stage 1's result for a chunk of training pairs, ready for the parent to append: the kept
    pairs' tokenized lines, their word counts, and why the others were dropped."""

    lines: tuple[bytes, bytes]
    words: tuple[Counter, Counter]
    kept: int
    dropped: Counter


def tokenize_chunk(pairs: list[tuple[str, str]], max_len: int, max_ratio: float) -> TokenizedChunk:
    """Tokenize and filter raw training pairs. A pair with a NUL byte, or too long to fit in
    `max_len` tokens, is dropped before tokenizing it. Filtering, joining and counting happen
    here, not in the parent, which would otherwise hold every worker back (one process feeds them all)."""
    src, tgt = _worker["src"], _worker["tgt"]
    max_chars = MAX_CHARS_PER_TOKEN * max_len
    lines: tuple[list[str], list[str]] = ([], [])
    words: tuple[list[str], list[str]] = ([], [])
    dropped: Counter = Counter()
    for s, t in pairs:
        if "\x00" in s or "\x00" in t:
            reason: str | None = "nul_byte"
        elif max(len(s), len(t)) > max_chars:
            reason = "too_long"
        else:
            pair = src.tokenize(s), tgt.tokenize(t)
            reason = drop_reason(*pair, max_len, max_ratio)
        if reason:
            dropped[reason] += 1
            continue
        for side, side_lines, side_words in zip(pair, lines, words):
            side_lines.append(" ".join(side))
            side_words.extend(side)
    return TokenizedChunk(tuple("".join(f"{line}\n" for line in side).encode("utf-8") for side in lines),
                          (Counter(words[0]), Counter(words[1])), len(lines[0]), dropped)


def segment_words(words: list[str]) -> tuple[dict[str, tuple[str, ...]], Counter, Counter]:
    """Stage 3 in a worker: distinct training words -> their BPE cache entries, and the subword
    counts they make on each side (the word counts come with the inherited state)."""
    processor = _worker["src"]
    segmentations = processor.segmentations(words)
    src, tgt = (subword_counts(processor, {w: side[w] for w in words if w in side}) for side in _worker["word_counts"])
    return segmentations, src, tgt


@dataclass
class Packed:
    """A chunk's ids per side, concatenated, with sentence lengths: the parent only appends bytes."""

    ids: tuple[np.ndarray, np.ndarray]
    lengths: tuple[np.ndarray, np.ndarray]
    unknown: tuple[int, int]
    too_long: int


def binarize_chunk(pairs: list[tuple[str, str]], tokenize: bool, max_len: int | None) -> Packed:
    """Lines -> (tokenize, unless done already) -> BPE -> ids, packed; pairs over max_len are dropped."""
    src, tgt = _worker["src"], _worker["tgt"]
    return _encode(((src.tokenize(s), tgt.tokenize(t)) if tokenize else (s.split(), t.split()) for s, t in pairs),
                   max_len)


def sample_range(lines: LineRange, copy: int, alpha: float, max_len: int) -> Packed:
    """Tokenized training lines segmented anew, sampled from the SentencePiece model (subword
    regularization), packed. Seeded by the chunk and the copy: any number of workers writes the
    same files."""
    import sentencepiece

    sentencepiece.set_random_generator_seed((copy * 1_000_003 + lines.src_offset) % (1 << 31))
    src, tgt = _worker["src"], _worker["tgt"]
    return _encode(((src.sample(s.split(), alpha), tgt.sample(t.split(), alpha)) for s, t in lines.read()), max_len)


def _encode(pairs: Iterable[tuple[list[str], list[str]]], max_len: int | None) -> Packed:
    """Pairs of word (or piece) lists -> ids, packed; pairs over max_len are dropped."""
    sides: tuple[list[list[int]], list[list[int]]] = ([], [])
    too_long = 0
    for src_words, tgt_words in pairs:
        s_ids, t_ids = _worker["src_ids"].encode(src_words), _worker["tgt_ids"].encode(tgt_words)
        if max_len is not None and max(len(s_ids), len(t_ids)) > max_len:
            too_long += 1
            continue
        sides[0].append(s_ids)
        sides[1].append(t_ids)
    (src_ids, src_lengths), (tgt_ids, tgt_lengths) = _pack(sides[0]), _pack(sides[1])
    return Packed((src_ids, tgt_ids), (src_lengths, tgt_lengths),
                  (int((src_ids == UNK_ID).sum()), int((tgt_ids == UNK_ID).sum())), too_long)


def _pack(sentences: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Ids back to back (in the data's dtype) and the length of each sentence."""
    lengths = np.fromiter(map(len, sentences), np.int64, len(sentences))
    ids = np.fromiter(itertools.chain.from_iterable(sentences), _worker["dtype"], int(lengths.sum()))
    return ids, lengths


@dataclass(frozen=True)
class LineRange:
    """`lines` consecutive lines of two aligned files, starting at these byte offsets."""

    src: Path
    tgt: Path
    src_offset: int
    tgt_offset: int
    lines: int

    def read(self) -> list[tuple[str, str]]:
        with open(self.src, "rb") as fs, open(self.tgt, "rb") as ft:
            fs.seek(self.src_offset)
            ft.seek(self.tgt_offset)
            return [(fs.readline().decode("utf-8").rstrip("\n"), ft.readline().decode("utf-8").rstrip("\n"))
                    for _ in range(self.lines)]


def binarize_range(lines: LineRange, max_len: int) -> Packed:
    """Tokenized training lines, read by the worker itself (the parent sends only offsets)."""
    return binarize_chunk(lines.read(), tokenize=False, max_len=max_len)


def leave_signals_to_parent() -> None:
    """In a worker: Ctrl-C reaches the whole process group, but only the parent reports it and
    cleans up; it ends the workers with SIGTERM, which ends them silently."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


DRAIN_SECONDS = 60  # at most, for the chunks in flight when a stage stops (a worker may have died)


class Workers:
    """`workers` processes given `init_worker(**state)` once (or this process when workers == 1),
    mapping a function over chunks in order, with a bounded number of chunks in flight."""

    def __init__(self, workers: int, **state: Any) -> None:
        self.workers, self.state = workers, state
        self.pool: Any = None
        self.pending: deque = deque()  # results asked for and not yet taken, oldest first

    def __enter__(self) -> Workers:
        init_worker(**self.state)  # in this process; forked workers inherit it, caches included
        if self.workers > 1:
            # The workers' garbage collector would otherwise walk every object inherited from this
            # process, writing to (and so copying) nearly all its pages (preprocess_speed.py
            # measures the stages).
            gc.freeze()
            try:
                self.pool = multiprocessing.get_context("fork").Pool(self.workers, initializer=leave_signals_to_parent)
            finally:
                gc.unfreeze()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop the workers once none is sending a result: a worker killed in the middle of one
        leaves half a message in the pool's results pipe, and Pool.terminate() then waits forever
        for the rest (an interrupted run hung). The chunks in flight (a few) finish first."""
        if self.pool is not None:
            self.pool.close()
            deadline = time.monotonic() + DRAIN_SECONDS
            for result in self.pending:
                result.wait(max(0.0, deadline - time.monotonic()))
            self.pool.terminate()

    def map(self, fn: Callable, items: Iterable[Any]) -> Iterator[Any]:
        if self.pool is None:
            yield from map(fn, items)
            return
        for item in items:
            self.pending.append(self.pool.apply_async(fn, (item,)))
            if len(self.pending) >= 4 * self.workers:
                yield self.pending.popleft().get()
        while self.pending:
            yield self.pending.popleft().get()


def drop_reason(src: list[str], tgt: list[str], max_len: int, max_ratio: float) -> str | None:
    """Why a training pair is unusable: an empty side, too long, or too unequal in length."""
    if not src or not tgt:
        return "empty"
    if len(src) > max_len or len(tgt) > max_len:
        return "too_long"
    if max(len(src), len(tgt)) / min(len(src), len(tgt)) > max_ratio:
        return "length_ratio"
    return None
