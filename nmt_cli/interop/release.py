"""Released models: a `Release` as `nmt import` reads it (import_transformers.py,
import_marian.py), before importer.py makes it ours (its architecture, its weights under our
names but in Marian's layouts, its vocabularies with the ids of their special roles, its
SentencePiece models and decoding settings), the reading both release formats share, and Marian's
layout of the sinusoid."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nmt_cli.errors import NmtError
from nmt_cli.model.architecture import ModelConfig
from nmt_cli.text.pieces import load_sentencepiece
from nmt_cli.text.vocab import SPECIALS


def sines_then_cosines(d_model: int) -> torch.Tensor:
    """Marian's dimension i is our dimension order[i]: our sin/cos pairs, sines first."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


@dataclass
class Side:
    """One side's vocabulary as released: tokens by id, and the ids of its special roles."""

    tokens: list[str]
    pad: int  # the row our <pad> takes
    start: int  # the row the decoder starts from (our <s>)
    eos: int
    unk: int

    def rows(self, where: str) -> tuple[list[int], list[str]]:
        """The released row of each of our ids, and our tokens after the specials (`where` names
        the vocabulary in errors)."""
        roles = [self.pad, self.start, self.eos, self.unk]
        taken = set(roles)
        rest = [i for i in range(len(self.tokens)) if i not in taken]
        clashes = [self.tokens[i] for i in rest if self.tokens[i] in SPECIALS]
        if clashes:
            raise NmtError(f"{where}: {clashes[0]!r} is an ordinary token there, and nmt-cli reserves it")
        return roles + rest, [self.tokens[i] for i in rest]


@dataclass
class Release:
    """A released model as read from its files, before it becomes ours: weights under our names in
    Marian's layout (sines first; rows in its token ids)."""

    config: ModelConfig
    weights: dict[str, Tensor]
    source: Side
    target: Side
    shared: bool
    source_spm: bytes
    target_spm: bytes
    langs: tuple[str, str]
    search: dict[str, Any] = field(default_factory=dict)
    never_output: list[str] = field(default_factory=list)
    origin: str = ""


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NmtError(f"{path}: missing (a released model needs it)") from None
    except (OSError, ValueError) as e:
        raise NmtError(f"{path}: unreadable ({e})") from None


def tokens_by_id(mapping: dict[str, int], path: Path) -> list[str]:
    """The tokens of a vocabulary file's {token: id} by id: every id from 0 up, once."""
    tokens = {i: t for t, i in mapping.items()}
    if sorted(tokens) != list(range(len(mapping))):
        raise NmtError(f"{path}: its ids are not 0 to {len(mapping) - 1}, each once")
    return [tokens[i] for i in range(len(tokens))]


def token_id(tokens: list[str], name: str, source: Path) -> int:
    try:
        return tokens.index(name)
    except ValueError:
        raise NmtError(f"{source}: the vocabulary has no {name!r}") from None


def sentencepiece_file(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise NmtError(f"{path}: missing (a released model needs it)") from None
    load_sentencepiece(data, str(path), specials=False)
    return data
