"""A lexical shortlist (Marian's `--shortlist`, CTranslate2's vocabulary map): for each source
token, the K target tokens most likely aligned to it, and the N most frequent target tokens. A
search then projects to and normalizes over only its batch's set (their union, the specials and
any forced or constrained token), a few hundred columns of the output layer instead of all.

The lexical probabilities are IBM model 1's p(target | source) (Brown et al., 1993), five EM
iterations over the training split of a data directory, counted in chunks of pairs: linear in
the corpus, as fast_align and eflomal are, and chosen over Dice's coefficient by
tests/benchmarks/shortlist_speed.py.

The file is text: a header line, a JSON line (N, K, each vocabulary's size and sha256), then one
line per source token id: its candidates' ids."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from nmt_cli.errors import NmtError
from nmt_cli.files import small_file
from nmt_cli.text.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID

if TYPE_CHECKING:
    from nmt_cli.model.checkpoint import ModelBundle

HEADER = "nmt-cli shortlist 1"
SHORTLIST_BYTES = 1 << 30  # 100 candidates for each of 250,000 source tokens fit 10 times over
ITERATIONS = 5
CHUNK_PAIRS = 20_000  # pairs whose co-occurrences are counted at once


def vocabulary_digest(tokens: Sequence[str]) -> str:
    """What a shortlist checks a model's vocabulary against: the sha256 of its tokens in order."""
    return hashlib.sha256("\n".join(tokens).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Shortlist:
    """`candidates` (source vocabulary, K): each source token's target ids, best first, -1 where
    it has fewer; `frequent`: the N most frequent target ids."""

    candidates: np.ndarray
    frequent: np.ndarray
    source_digest: str
    target_digest: str
    target_size: int

    def columns(self, sources: Iterable[Sequence[int]], extra: Iterable[int] = (), device: torch.device | None = None
                ) -> torch.Tensor:
        """The sorted target ids a batch of `sources` may output: the candidates of its tokens, the
        frequent ones, the specials, and `extra` (a prefix's, a constraint's)."""
        ids = np.concatenate([np.asarray(list(s), dtype=np.int64) for s in sources] or [np.zeros(0, np.int64)])
        chosen = self.candidates[ids[ids < len(self.candidates)]].ravel()
        wanted = np.concatenate([chosen[chosen >= 0], self.frequent, [PAD_ID, BOS_ID, EOS_ID, UNK_ID],
                                 np.fromiter(extra, dtype=np.int64)])
        return torch.from_numpy(np.unique(wanted.astype(np.int64))).to(device)

    def check(self, source_tokens: Sequence[str], target_tokens: Sequence[str], name: str) -> None:
        """Refuse a shortlist made for other vocabularies than a model's."""
        for side, tokens, digest in (("source", source_tokens, self.source_digest),
                                     ("target", target_tokens, self.target_digest)):
            if vocabulary_digest(tokens) != digest:
                raise NmtError(f"{name}: a shortlist for another {side} vocabulary than the model's ({len(tokens)} "
                               "tokens); make one from the model's data directory with `nmt shortlist`")

    def save(self, path: Path) -> None:
        """Write the file atomically: it appears only when complete."""
        from nmt_cli.files import write_text

        head = {"first": len(self.frequent), "best": self.candidates.shape[1], "source_size": len(self.candidates),
                "target_size": self.target_size, "source_vocabulary": self.source_digest,
                "target_vocabulary": self.target_digest, "frequent": self.frequent.tolist()}
        rows = (" ".join(map(str, row[row >= 0].tolist())) for row in self.candidates)
        write_text(path, "\n".join([HEADER, json.dumps(head), *rows]) + "\n")

    @classmethod
    def load(cls, path: Path, model: ModelBundle | None = None) -> Shortlist:
        """A shortlist file; one that is not one, or is cut short, is refused naming its line, and
        with a `model`, one made for other vocabularies than the model's."""
        try:
            lines = small_file(path, "a shortlist", SHORTLIST_BYTES).decode("utf-8").split("\n")
        except UnicodeDecodeError as e:
            raise NmtError(f"{path}: unreadable ({e})") from None
        if lines[0] != HEADER:
            raise NmtError(f"{path}:1: not a shortlist of `nmt shortlist` (expected {HEADER!r})")
        try:
            head = json.loads(lines[1])
            size, best, target_size = int(head["source_size"]), int(head["best"]), int(head["target_size"])
            frequent = np.asarray(head["frequent"], np.int64)
            digests = str(head["source_vocabulary"]), str(head["target_vocabulary"])
        except (ValueError, KeyError, TypeError, IndexError) as e:
            raise NmtError(f"{path}:2: a damaged shortlist header ({type(e).__name__}: {e})") from None
        if frequent.ndim != 1 or ((frequent < 0) | (frequent >= target_size)).any():
            raise NmtError(f"{path}:2: a frequent token's id outside the target vocabulary (0 to {target_size - 1})")
        rows = lines[2:2 + size]
        if len(rows) < size or lines[2 + size:] != [""]:
            raise NmtError(f"{path}:{len(lines)}: {len(lines) - 3} source tokens, the header says {size} "
                           "(a truncated or altered file)")
        candidates = np.full((size, best), -1, dtype=np.int64)
        for number, row in enumerate(rows, start=3):
            tokens = row.split()
            ids = [int(t) for t in tokens if t.isdigit()]
            if len(ids) != len(tokens) or len(ids) > best or any(t >= target_size for t in ids):
                raise NmtError(f"{path}:{number}: more than {best} candidates, or an id outside the target "
                               "vocabulary")
            candidates[number - 3, :len(ids)] = ids
        shortlist = cls(candidates, frequent, *digests, target_size)
        if model is not None:
            shortlist.check(model.src_vocab.tokens, model.tgt_vocab.tokens, str(path))
        return shortlist


def make(data_dir: Path, first: int, best: int) -> Shortlist:
    """The shortlist of a data directory's training split (`nmt shortlist`)."""
    from nmt_cli.corpus.datadir import DataDir

    data = DataDir.open(data_dir)
    source_vocab, target_vocab = data.vocabularies()
    train = data.split("train")
    candidates, frequent = learn(train.source.data, train.source.offsets, train.target.data, train.target.offsets,
                                 len(source_vocab), len(target_vocab), first, best)
    return Shortlist(candidates, frequent, vocabulary_digest(source_vocab.tokens),
                     vocabulary_digest(target_vocab.tokens), len(target_vocab))


def learn(source: np.ndarray, source_offsets: np.ndarray, target: np.ndarray, target_offsets: np.ndarray,
          source_size: int, target_size: int, first: int, best: int) -> tuple[np.ndarray, np.ndarray]:
    """(candidates, frequent) from aligned token arrays (all pairs' tokens concatenated, each
    side with its offsets): IBM model 1's best `best` targets of each source token, and the
    `first` most frequent targets; the specials are never candidates (a search adds them)."""
    frequency = np.bincount(target, minlength=target_size)
    frequency[:4] = 0
    frequent = np.argsort(-frequency, kind="stable")[:first]
    frequent = np.sort(frequent[frequency[frequent] > 0])
    keys = np.unique(np.concatenate([_cooccurrences(chunk)[0] for chunk in
                                     _chunks(source, source_offsets, target, target_offsets, source_size,
                                             target_size)]))
    probability = np.ones(len(keys))  # t(target | source), uniform to start
    for _ in range(ITERATIONS):
        counts = np.zeros(len(keys))
        for chunk in _chunks(source, source_offsets, target, target_offsets, source_size, target_size):
            pair_keys, occurrence = _cooccurrences(chunk)
            index = np.searchsorted(keys, pair_keys)
            p = probability[index]
            counts += np.bincount(index, p / np.bincount(occurrence, p)[occurrence], minlength=len(keys))
        totals = np.bincount(keys // target_size, counts, minlength=source_size + 1)
        probability = counts / totals[keys // target_size]
    return _best(keys, probability, source_size, target_size, best), frequent


def _chunks(source: np.ndarray, source_offsets: np.ndarray, target: np.ndarray, target_offsets: np.ndarray,
            source_size: int, target_size: int) -> Iterable[tuple[np.ndarray, ...]]:
    """The pairs in chunks: each chunk's source tokens with a NULL (id `source_size`) appended to
    every sentence, its offsets, its target tokens and offsets, and the target vocabulary size."""
    for start in range(0, len(source_offsets) - 1, CHUNK_PAIRS):
        stop = min(start + CHUNK_PAIRS, len(source_offsets) - 1)
        src_off, tgt_off = source_offsets[start:stop + 1], target_offsets[start:stop + 1]
        lengths = np.diff(src_off) + 1
        with_null = np.full(int(lengths.sum()), source_size, dtype=np.int64)
        ends = np.cumsum(lengths)
        positions = np.arange(len(with_null)) - np.repeat(ends - lengths, lengths)
        real = positions < np.repeat(lengths - 1, lengths)
        with_null[real] = source[src_off[0]:src_off[-1]]
        yield (with_null, np.concatenate([[0], ends]), np.asarray(target[tgt_off[0]:tgt_off[-1]], dtype=np.int64),
               tgt_off - tgt_off[0], np.int64(target_size))


def _cooccurrences(chunk: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Every (source token, target token) of each pair of a chunk as the key source * V + target,
    with the index of the target occurrence it explains."""
    source, source_offsets, target, target_offsets, target_size = chunk
    sentence = np.repeat(np.arange(len(target_offsets) - 1), np.diff(target_offsets))  # of each target token
    sources = np.diff(source_offsets)[sentence]  # how many source tokens (NULL included) each sees
    occurrence = np.repeat(np.arange(len(target)), sources)
    first = np.repeat(source_offsets[:-1][sentence], sources)
    within = np.arange(len(occurrence)) - np.repeat(np.cumsum(sources) - sources, sources)
    return source[first + within] * target_size + target[occurrence], occurrence


def _best(keys: np.ndarray, probability: np.ndarray, source_size: int, target_size: int, best: int) -> np.ndarray:
    """(source vocabulary, best) target ids of each source token by probability, -1 padded."""
    source, target = keys // target_size, keys % target_size
    keep = (source < source_size) & (target >= 4) & (probability > 0)
    source, target, probability = source[keep], target[keep], probability[keep]
    order = np.lexsort((-probability, source))
    source, target = source[order], target[order]
    rank = np.arange(len(source)) - np.searchsorted(source, source)
    chosen = rank < best
    candidates = np.full((source_size, best), -1, dtype=np.int64)
    candidates[source[chosen], rank[chosen]] = target[chosen]
    return candidates
