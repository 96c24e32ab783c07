"""The search's decoder step as a CUDA graph: on a GPU a step of a small model is hundreds of
kernel launches of a few microseconds each, which the host issues more slowly than the GPU runs
them; replaying a recorded graph is one launch (`nmt translate --cuda-graphs`).

A graph replays fixed kernels on fixed memory, so everything a step touches has a fixed shape
and address (`StaticDecoder`): key/value caches of a fixed length (`StaticCache`), of which a step
reads only the positions of its length bucket (a graph per bucket, so that short outputs do not
pay for the longest), the position a device tensor, sentence slots and source keys padded, and one
decoder per shape bucket (`DecoderGraphs`). On the CPU the same code runs eagerly
(tests/decode/test_graphs.py compares it, and an emulation of a graph's replay, with the search
on growing caches).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt_cli.decode.incremental import start, step_output
from nmt_cli.model.transformer import Transformer

BUCKET = 16  # source keys, cache lengths and the positions a step reads: multiples of this


def rounded_up(n: int) -> int:
    """The multiple of BUCKET at or above `n`."""
    return -(-n // BUCKET) * BUCKET


def capture(step: Callable[[], Tensor], device: torch.device, pool: tuple[int, int] | None) -> Callable[[], Tensor]:
    """A callable that runs `step` again, on whatever its tensors then hold: on CUDA, `step`'s
    kernels recorded once as a CUDA graph into memory `pool` and replayed (one launch instead of
    one per kernel); on the CPU, `step` itself. `step` must read and write only tensors that
    outlive it, read nothing back to the host, and return the same tensor each time (it is
    overwritten)."""
    if device.type != "cuda":
        return step
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        step()  # lazy initialisations (cuBLAS workspaces) happen here, not in the capture
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = step()

    def replay() -> Tensor:
        graph.replay()
        return out

    return replay


class StaticCache:
    """A decoder layer's self-attention keys and values in buffers of a fixed shape (rows,
    heads, length, d), so that a step's kernels are the same at every step of a length bucket (a
    model.KeyValueCache): it writes its keys and values at `position` (a device tensor) and
    attends over the bucket's first `length` positions, later ones masked. Taking the search's
    `rows` (a device tensor too) copies those positions into the other of two buffers (`parity`)."""

    def __init__(self, rows: Tensor, heads: int, length: int, d_k: int, d_v: int, position: Tensor,
                 dtype: torch.dtype) -> None:
        def buffers() -> tuple[Tensor, Tensor]:
            return (torch.zeros(rows.size(0), heads, length, d_k, dtype=dtype, device=position.device),
                    torch.zeros(rows.size(0), heads, length, d_v, dtype=dtype, device=position.device))

        self.buffers = (buffers(), buffers())
        self.rows, self.position, self.parity, self.length = rows, position, 0, length
        self.positions = torch.arange(length, device=position.device)

    def extend(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Keys and values of the bucket's positions (the search's rows of the last step's, then
        this step's), and the mask (1, 1, 1, length) of the positions so far."""
        read, write = self.buffers[self.parity], self.buffers[1 - self.parity]
        write = tuple(out[:, :, : self.length] for out in write)
        for past, out, new in zip(read, write, (k, v)):
            torch.index_select(past[:, :, : self.length], 0, self.rows, out=out)
            out.index_copy_(2, self.position, new)
        return write[0], write[1], (self.positions[: self.length] <= self.position).view(1, 1, 1, -1)


class StaticDecoder:
    """A model's search step (`decoding.step_output`) over tensors of fixed shape, replayed by
    `capture`: `sentences` slots of `beam` decoder rows each, sources padded to `src_len` keys,
    caches of `length` positions. A step at position t reads and writes only the caches' first
    positions up to the multiple of `BUCKET` above t (its length bucket): one graph per
    bucket and cache parity, captured when the search first reaches it. A batch of fewer
    sentences, or one whose sentences leave the search, leaves slots unused (they repeat the first
    sentence); the search reads the first rows. It is the step's `decoding.DecoderState`."""

    def __init__(self, model: Transformer, sentences: int, beam: int, src_len: int, length: int,
                 pool: tuple[int, int] | None) -> None:
        config, weight = model.config, model.tgt_embed.tokens.weight
        device, dtype, rows = weight.device, weight.dtype, sentences * beam
        self.model, self.sentences, self.length, self.pool = model, sentences, length, pool
        self.memory_kv = [(torch.zeros(sentences, config.heads, src_len, config.d_k, dtype=dtype, device=device),
                           torch.zeros(sentences, config.heads, src_len, config.d_v, dtype=dtype, device=device))
                          for _ in range(config.decoder_layers)]
        self.src_mask = torch.ones(sentences, 1, 1, src_len, dtype=torch.bool, device=device)
        self.position = torch.zeros(1, dtype=torch.long, device=device)
        self.identity = torch.arange(rows, device=device)
        self.rows, self.tokens = self.identity.clone(), torch.zeros(rows, dtype=torch.long, device=device)
        self.caches = [StaticCache(self.rows, config.heads, length, config.d_k, config.d_v, self.position, dtype)
                       for _ in range(config.decoder_layers)]
        self.parity, self.steps = 0, 0
        self.replays: dict[tuple[int, int], Callable[[], Tensor]] = {}  # (cache length, parity): the step

    def _step(self, length: int, parity: int) -> Tensor:
        for cache in self.caches:
            cache.length, cache.parity = length, parity
        return step_output(self.model, self.tokens, self)

    def _replay(self, length: int, parity: int) -> Callable[[], Tensor]:
        """The step over caches of `length` positions read from buffers `parity`, captured at its
        first use. Capturing runs the step once: it writes only what the replay writes again, but
        advances the position and the rows, which are put back."""
        if (length, parity) not in self.replays:
            position, rows = self.position.clone(), self.rows.clone()
            self.replays[length, parity] = capture(lambda: self._step(length, parity), self.position.device,
                                                   self.pool)
            self.position.copy_(position)
            self.rows.copy_(rows)
        return self.replays[length, parity]

    def advance(self) -> None:
        """Called by the step itself, so it is part of what is replayed."""
        self.position.add_(1)
        self.rows.copy_(self.identity)

    def start(self, memory_kv: list[tuple[Tensor, Tensor]], src_mask: Tensor) -> None:
        """Start a search over the encoder keys/values and mask of up to `sentences` sentences."""
        self._load(memory_kv, src_mask)
        self.position.zero_()
        self.rows.copy_(self.identity)
        self.parity, self.steps = 0, 0

    def step(self, tokens: Tensor) -> Tensor:
        """The decoder's output for the next token of the search's rows `tokens`."""
        self.tokens[: tokens.size(0)] = tokens
        length = min(rounded_up(self.steps + 1), self.length)
        out = self._replay(length, self.parity)()
        self.parity, self.steps = 1 - self.parity, self.steps + 1
        return out[: tokens.size(0)]

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """`DecoderState.reorder` within the slots: the sentences kept move to the first ones."""
        self.rows[: rows.size(0)] = self.rows.index_select(0, rows)
        if sentences is not None:
            self._load([(k.index_select(0, sentences), v.index_select(0, sentences)) for k, v in self.memory_kv],
                       self.src_mask.index_select(0, sentences))

    def _load(self, memory_kv: list[tuple[Tensor, Tensor]], src_mask: Tensor) -> None:
        """The sentences' encoder keys/values and mask into the first slots; the others repeat the first."""
        slots = F.pad(torch.arange(src_mask.size(0), device=src_mask.device), (0, self.sentences - src_mask.size(0)))
        src_len = src_mask.size(-1)
        for static, given in zip(self.memory_kv, memory_kv):  # keys beyond src_len are masked
            for into, x in zip(static, given):
                into[:, :, :src_len] = x.index_select(0, slots)
        self.src_mask.zero_()
        self.src_mask[..., :src_len] = src_mask.index_select(0, slots)


Shape = tuple[int, int, int, int]  # sentence slots, rows per sentence, source keys, positions


class DecoderGraphs:
    """A model's search steps on `StaticDecoder`s, one per shape: sentence slots a power of two,
    source keys and positions multiples of BUCKET, so that batches of similar size share one. The
    most recently used are kept: at most `KEEP`, and on a GPU together at most a quarter of its
    memory (a decoder holds two caches of its largest batch, padded: the eager search's one grows).
    Their graphs share one memory pool (they replay one at a time, on one stream)."""

    KEEP = 4

    def __init__(self, model: Transformer) -> None:
        self.model = model
        self.decoders: dict[Shape, StaticDecoder] = {}
        self.pool: tuple[int, int] | None = None
        device = model.tgt_embed.tokens.weight.device
        self.budget = torch.cuda.get_device_properties(device).total_memory // 4 if device.type == "cuda" else None

    def start(self, src: Tensor, beam: int, length: int) -> StaticDecoder:
        """Encode `src` and start a search of `beam` rows per sentence and up to `length` positions."""
        state = start(self.model, src)
        sentences, src_len = src.size(0), src.size(1)
        shape = (1 << (sentences - 1).bit_length(), beam, rounded_up(src_len),
                 min(rounded_up(length), self.model.config.max_positions))
        decoder = self.decoders.pop(shape, None)
        if decoder is None:
            self._make_room(self.size(shape))
            decoder = StaticDecoder(self.model, *shape, self._pool(src.device))
        self.decoders[shape] = decoder  # the most recent last
        decoder.start(state.memory_kv, state.src_mask)
        return decoder

    def _pool(self, device: torch.device) -> tuple[int, int] | None:
        """The graphs' memory pool. Once the last graph of a pool is gone, torch has released the
        pool and no graph can be captured into it again: with no decoder left, a new pool."""
        if device.type == "cuda" and (self.pool is None or not self.decoders):
            self.pool = torch.cuda.graph_pool_handle()
        return self.pool

    def size(self, shape: Shape) -> int:
        """Bytes of a decoder's buffers: encoder keys/values and two caches per layer."""
        sentences, beam, src_len, length = shape
        config, weight = self.model.config, self.model.tgt_embed.tokens.weight
        per_key = config.heads * (config.d_k + config.d_v) * weight.element_size() * config.decoder_layers
        return per_key * sentences * (src_len + 2 * beam * length)

    def _make_room(self, needed: int) -> None:
        """Drop the least recently used decoders until a new one of `needed` bytes fits."""
        while self.decoders and (len(self.decoders) >= self.KEEP or self.budget is not None and needed + sum(
                self.size(shape) for shape in self.decoders) > self.budget):
            del self.decoders[next(iter(self.decoders))]
