"""One step of a search: the models (one, or an ensemble whose probabilities are averaged in log
space) run their decoders over their states, an output layer turns the outputs into the next
token's log-probabilities (over the whole vocabulary, or a shortlist's columns), and the k most
probable tokens of each row are chosen under the controls (controls.py), the forced tokens and
the terms (constraints.py). search.py's beam search and sampling.py's sampling both step here."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from nmt_cli.decode import incremental as decoding
from nmt_cli.decode.controls import OutputControls
from nmt_cli.decode.graphs import DecoderGraphs
from nmt_cli.decode.incremental import DecoderState
from nmt_cli.device import block_floats
from nmt_cli.model.kernels import ShortlistProjection, search_projection, top_k
from nmt_cli.model.transformer import Transformer
from nmt_cli.text.vocab import EOS_ID


class SearchInterrupted(Exception):
    """A search stopped before its end (`Ensemble.deadline`)."""


def averaged(log_probs: list[Tensor]) -> Tensor:
    """An ensemble's log-probabilities: the log of the mean of its members' probabilities."""
    if len(log_probs) == 1:
        return log_probs[0]
    return torch.logsumexp(torch.stack(log_probs), 0) - math.log(len(log_probs))


@dataclass(frozen=True)
class OutputLayer:
    """One search's projection of each model's decoder output to the next token's log-probabilities
    (averaged in log space over an ensemble): over the whole vocabulary, or with a shortlist over
    its `columns` alone. Then the search picks among those columns: its tokens (and the controls'
    and constraints') go in as positions among them (`positions`) and come out as ids (`ids`)."""

    projections: list[Callable[[Tensor], Tensor]]
    width: int  # the columns a row has: the vocabulary's size, or the shortlist's
    columns: Tensor | None = None
    inverse: Tensor | None = None  # each vocabulary id's position among the columns (-1: none)

    def log_probs(self, outputs: list[Tensor]) -> Tensor:
        """(rows, columns) log-probabilities of the decoder `outputs` (one (rows, d_model) per model)."""
        return averaged([torch.log_softmax(project(out).float(), dim=-1)
                         for project, out in zip(self.projections, outputs)])

    def positions(self, ids: Tensor) -> Tensor:
        """Token `ids` (-1: none) as positions among the columns (-1: none, or not a column)."""
        if self.inverse is None:
            return ids
        return torch.where(ids >= 0, self.inverse[ids.clamp(min=0)], -1)

    def ids(self, positions: Tensor) -> Tensor:
        """Positions among the columns as token ids."""
        return positions if self.columns is None else self.columns[positions]

    def controls(self, controls: OutputControls) -> OutputControls:
        """`controls` for positions among the columns (a banned token outside them needs no ban)."""
        if self.inverse is None:
            return controls
        banned = self.positions(controls.banned)
        return dataclasses.replace(controls, banned=banned[banned >= 0], eos=int(self.inverse[EOS_ID]))


class Ensemble:
    """One or more models decoding together; their probabilities are averaged (in log space) each
    step. With `graphs`, beam search runs each model's decoder on tensors of fixed shape, which a
    GPU replays as CUDA graphs (`graphs.DecoderGraphs`); sampling cannot."""

    def __init__(self, models: Sequence[Transformer], graphs: bool = False, never: Sequence[int] = ()) -> None:
        self.models = list(models)
        self.never = list(never)  # ids the search never outputs besides the specials: vocabulary fillers
        self.deadline: float | None = None  # time.monotonic() at which a search stops (a draining server)
        self.projections = [search_projection(m) for m in self.models]
        self.shortlisted: list[ShortlistProjection] | None = None  # made at the first search with a shortlist
        self.max_positions = min(m.config.max_positions for m in self.models)
        weight = self.models[0].tgt_embed.tokens.weight
        self.vocab_size = weight.size(0)
        self.graphs = [DecoderGraphs(m) for m in self.models] if graphs else None

    def check_deadline(self) -> None:
        """Raise SearchInterrupted once past the deadline (checked at every search step)."""
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise SearchInterrupted("the search was stopped at its deadline")

    def release_graphs(self) -> None:
        """Give back the fixed-shape decoders' memory; the next search makes the ones it needs."""
        for graphs in self.graphs or []:
            graphs.decoders.clear()

    def output_layer(self, columns: Tensor | None = None) -> OutputLayer:
        """The output layer of a search: to the whole vocabulary, or to a shortlist's `columns`
        (sorted token ids, EOS among them)."""
        if columns is None:
            return OutputLayer(self.projections, self.vocab_size)
        inverse = torch.full((self.vocab_size,), -1, dtype=torch.long, device=columns.device)
        inverse[columns] = torch.arange(len(columns), device=columns.device)
        if self.shortlisted is None:
            self.shortlisted = [ShortlistProjection(m) for m in self.models]
        return OutputLayer([p.rows(columns) for p in self.shortlisted], len(columns), columns, inverse)

    def start(self, src: Tensor, beam: int = 1, length: int = 0) -> list[DecoderState]:
        """Encode `src` for a search of `beam` rows per sentence and up to `length` positions."""
        if self.graphs is not None:
            return [graphs.start(src, beam, length) for graphs in self.graphs]
        return [decoding.start(model, src) for model in self.models]

    def top_tokens(self, history: Tensor, states: list[DecoderState], k: int, controls: OutputControls,
                   forced: Tensor | None, rules: tuple[Tensor, Tensor] | None = None,
                   layer: OutputLayer | None = None) -> tuple[Tensor, Tensor]:
        """Log-probabilities and ids (rows, k), best first, of the k most probable next tokens of
        each row, given its tokens so far (`history`, BOS first), under the `controls` and through
        the output `layer` (default: the whole vocabulary's; the `controls` are its own); a row
        whose `forced` entry is a token id (not -1) can take only that token, at its own
        log-probability (EOS at the maximum length, a prefix). With `rules` (`Terms.rules`: each
        row's banned tokens and wanted ones, -1 for none), the wanted tokens follow the k (rows, k
        + wanted), at -inf where banned, repeated or none.

        Rows go through the projection, softmax and top-k in blocks of about `device.block_floats`
        log-probabilities, so that on the CPU the (rows, vocab) matrix never exists whole: memory
        stays small with large vocabularies, and each block is still in cache when it is read again.
        """
        layer = layer or self.output_layer()
        tokens, output = history[:, -1], layer.positions(history[:, 1:])
        outputs = [state.step(tokens) for state in states]
        forced = None if forced is None else layer.positions(forced)
        rules = None if rules is None else (layer.positions(rules[0]), layer.positions(rules[1]))
        rows = tokens.size(0)
        block = max(1, block_floats(tokens.device) // layer.width)
        values, indices = [], []
        for start in range(0, rows, block):
            part = slice(start, start + block)
            lp = layer.log_probs([out[part] for out in outputs])
            column = None if forced is None else forced[part].clamp(min=0).unsqueeze(1)
            own = None if column is None else lp.gather(1, column)  # a forced token keeps its log-probability
            controls.apply(lp, output[part], output.size(1))
            if rules is not None:
                _ban(lp, rules[0][part])
            if column is not None:
                _force(lp, forced[part], column, own)
            top_values, top_indices = top_k(lp, k)
            if rules is not None:
                top_values, top_indices = _with_wanted(lp, top_values, top_indices, rules[1][part])
            values.append(top_values)
            indices.append(top_indices)
        if len(values) == 1:  # one block, as on a GPU: no copy
            return values[0], layer.ids(indices[0])
        return torch.cat(values), layer.ids(torch.cat(indices))


def _ban(lp: Tensor, banned: Tensor) -> None:
    """Each row's `banned` tokens (rows, b; -1: none) at -inf, in place."""
    columns = banned.clamp(min=0)
    lp.scatter_(1, columns, lp.gather(1, columns).masked_fill(banned >= 0, -math.inf))


def _with_wanted(lp: Tensor, values: Tensor, indices: Tensor, wanted: Tensor) -> tuple[Tensor, Tensor]:
    """The top-k (`values`, `indices`) of each row followed by its `wanted` tokens (-1: none), each
    token once (phrases that begin alike want the same one)."""
    columns = wanted.clamp(min=0)
    again = (wanted.unsqueeze(2) == indices.unsqueeze(1)).any(2) | \
        (wanted.unsqueeze(2) == wanted.unsqueeze(1)).tril(-1).any(2)
    extra = lp.gather(1, columns).masked_fill((wanted < 0) | again, -math.inf)
    return torch.cat([values, extra], 1), torch.cat([indices, columns], 1)


def _force(lp: Tensor, forced: Tensor, column: Tensor, own: Tensor) -> None:
    """On rows with a forced token (>= 0, also at `column`), every other token banned, in place;
    the forced one at its `own` log-probability."""
    is_forced = (forced >= 0).unsqueeze(1)
    lp.masked_fill_(is_forced, -math.inf)
    lp.scatter_(1, column, torch.where(is_forced, own, lp.gather(1, column)))
