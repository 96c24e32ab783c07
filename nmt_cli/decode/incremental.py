"""Incremental decoding, as a search runs the decoder: one position at a time, over each layer's
cache of the earlier positions' keys and values, and over the encoder's keys and values,
computed once per source. A search (search.py) drives any `DecoderState`: the growing caches
here, or the fixed-shape ones of graphs.py that a GPU replays as CUDA graphs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from torch import Tensor

from nmt_cli.model.kernels import append_position
from nmt_cli.model.transformer import KeyValueCache, Transformer


class DecoderState(Protocol):
    """What a search step needs between steps: per decoder layer the encoder's keys and values
    (one row per sentence) and the cache of the earlier positions (one row per decoder row: a
    sentence's beams are consecutive rows), the source mask, and the next position. A search
    calls `step`; the step calls `advance`."""

    memory_kv: list[tuple[Tensor, Tensor]]
    src_mask: Tensor
    caches: Sequence[KeyValueCache]
    position: int | Tensor

    def step(self, tokens: Tensor) -> Tensor:
        """The decoder's output (rows, d_model) for the next token of each row, given its last
        token (`tokens`), before the projection to the vocabulary."""

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Continue from decoder rows `rows` (the beams a search kept), and where sentences are
        dropped or repeated, keep the encoder entries of `sentences`."""

    def advance(self) -> None:
        """Move on to the next position (called by the step itself)."""


def step_output(model: Transformer, tokens: Tensor, state: DecoderState) -> Tensor:
    """The decoder's output (rows, d_model) for the next token of each row, given its last token
    (`tokens`), before the projection to the vocabulary; advances `state`."""
    x = model.decode(tokens[:, None], state.memory_kv, state.src_mask, state.caches, state.position)
    state.advance()
    return x[:, 0]


class GrowingState:
    """A `DecoderState` of `model` whose caches grow by one position a step. Each step copies a
    layer's cache once, taking the rows the search kept and adding the new position's keys and
    values."""

    def __init__(self, model: Transformer, memory_kv: list[tuple[Tensor, Tensor]], src_mask: Tensor) -> None:
        self.model, self.memory_kv, self.src_mask = model, memory_kv, src_mask
        self.caches = [GrowingCache(self) for _ in memory_kv]
        self.rows: Tensor | None = None  # the cache rows to take at the next step (None: all, in order)
        self.position = 0

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """The caches take their rows at the next step, in the same copy that extends them."""
        if sentences is not None:
            self.memory_kv = [(k.index_select(0, sentences), v.index_select(0, sentences)) for k, v in self.memory_kv]
            self.src_mask = self.src_mask.index_select(0, sentences)
        self.rows = rows if self.rows is None else self.rows.index_select(0, rows)

    def step(self, tokens: Tensor) -> Tensor:
        return step_output(self.model, tokens, self)

    def advance(self) -> None:
        self.position, self.rows = self.position + 1, None


class GrowingCache:
    """A decoder layer's self-attention keys and values of the positions so far."""

    def __init__(self, state: GrowingState) -> None:
        self.state = state
        self.kv: tuple[Tensor, Tensor] | None = None

    def extend(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, None]:
        """Keys and values of every position so far (no mask needed: all are real)."""
        if self.kv is not None:
            rows = self.state.rows
            k, v = append_position(self.kv[0], k, rows), append_position(self.kv[1], v, rows)
        self.kv = (k, v)
        return k, v, None


def start(model: Transformer, src: Tensor) -> GrowingState:
    """Encode `src` and project the encoder output to each decoder layer's keys and values once,
    each laid out contiguously (as views of the fused projection, every step's attention would
    copy them)."""
    memory, src_mask = model.encode(src)
    return GrowingState(model, [(k.contiguous(), v.contiguous()) for k, v in model.memory_keys_values(memory)],
                        src_mask)
