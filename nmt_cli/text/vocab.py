"""Vocabulary: token <-> id, with the special symbols at fixed ids.

Saved as text, one `token count` per line in id order after the specials (fairseq's dict.txt
format), so a vocabulary file can be read, diffed and reused by hand.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from nmt_cli.errors import NmtError

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)
PAD_ID, BOS_ID, EOS_ID, UNK_ID = range(4)
FILLER = "madeupword{:04d}"  # the never-seen entries that pad a vocabulary (fairseq's name)


def start_row(decoder_start: str) -> int:
    """The row a target's first token (<s>) reads: ModelConfig.decoder_start's."""
    return EOS_ID if decoder_start == "eos" else BOS_ID


def model_ids(decoder_start: str, source_eos: bool) -> dict[str, Any]:
    """The ids a Transformer takes beyond the padding's, of ModelConfig's `decoder_start` (the id a
    target starts with and the row it reads, where they differ) and `source_eos` (an id a source
    ends with that the model never saw)."""
    row = start_row(decoder_start)
    return {"start": (BOS_ID, row) if row != BOS_ID else None, "unseen_end": None if source_eos else EOS_ID}


def _is_filler(token: str) -> bool:
    return token.startswith("madeupword") and token[10:].isdigit()


class VocabularyError(NmtError):
    """A vocabulary file that cannot be used; the message names the file and line."""


class Vocabulary:
    """Tokens in id order; ids 0-3 are pad, bos, eos, unk. A special's name may also be an ordinary
    token (a released model's `<s>`): it keeps its own id, and text reads as the special."""

    def __init__(self, tokens: Sequence[str], counts: Sequence[int] | None = None) -> None:
        self.tokens = list(SPECIALS) + [t for t in tokens]
        self.counts = [0] * len(SPECIALS) + list(counts or [0] * len(tokens))
        if len(set(tokens)) != len(tokens):
            raise VocabularyError("duplicate tokens in vocabulary")
        self.index = {token: i for i, token in reversed(list(enumerate(self.tokens)))}  # a special's id first
        # The entries `build` padded with: the trailing run of filler names (a checkpoint keeps no counts).
        self.fillers = list(itertools.takewhile(lambda i: _is_filler(self.tokens[i]),
                                                range(len(self.tokens) - 1, len(SPECIALS) - 1, -1)))[::-1]
        for i in self.fillers:  # text never reads as a filler: it is no word of the corpus
            del self.index[self.tokens[i]]

    @classmethod
    def build(cls, counts: Counter[str], min_count: int = 1, max_size: int | None = None,
              padding_factor: int = 1) -> Vocabulary:
        """Most frequent first, ties broken alphabetically, so the ids are stable across runs.

        `padding_factor`: append never-seen `madeupwordNNNN` entries (count 0) until the size is a
        multiple of it, as fairseq does: the embedding and pre-softmax matrices then have shapes
        that matrix kernels run fastest on.
        """
        ranked = sorted(((t, c) for t, c in counts.items() if c >= min_count and t not in SPECIALS),
                        key=lambda tc: (-tc[1], tc[0]))
        if max_size is not None:
            ranked = ranked[: max(0, max_size - len(SPECIALS))]
        tokens, taken = [t for t, _ in ranked], {t for t, _ in ranked}
        extra = (-(len(tokens) + len(SPECIALS))) % padding_factor
        fillers = (FILLER.format(i) for i in itertools.count())
        tokens += itertools.islice((t for t in fillers if t not in taken), extra)
        return cls(tokens, [c for _, c in ranked] + [0] * extra)

    def __len__(self) -> int:
        return len(self.tokens)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.tokens == other.tokens

    def encode(self, tokens: Iterable[str]) -> list[int]:
        return [self.index.get(t, UNK_ID) for t in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        return [self.tokens[i] for i in ids]

    def to_text(self) -> str:
        return "".join(f"{t} {c}\n" for t, c in zip(self.tokens[len(SPECIALS):], self.counts[len(SPECIALS):]))

    def save(self, path: Path) -> None:
        path.write_text(self.to_text(), encoding="utf-8")

    @classmethod
    def from_text(cls, text: str, source: str = "<vocabulary>") -> Vocabulary:
        """Parse `token count` lines; `source` names the file in error messages."""
        tokens, counts, seen = [], [], {}
        for number, line in enumerate(text.splitlines(), start=1):
            parts = line.rstrip("\n").split(" ")
            if len(parts) != 2 or not parts[0] or not parts[1].isdigit():
                raise VocabularyError(f"{source}:{number}: expected 'token count', got {line[:60]!r}")
            token = parts[0]
            if token in seen:
                raise VocabularyError(f"{source}:{number}: duplicate token {token!r} (also on line {seen[token]})")
            seen[token] = number
            tokens.append(token)
            counts.append(int(parts[1]))
        return cls(tokens, counts)

    @classmethod
    def load(cls, path: Path) -> Vocabulary:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise VocabularyError(f"{path}: cannot read vocabulary: {e}") from None
        return cls.from_text(text, str(path))
