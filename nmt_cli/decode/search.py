"""Beam search over the incremental decoder (§6.1: beam 4, length penalty alpha 0.6, max output
length = input length + 50, early stopping).

Batched: the encoder runs once per batch, and a sentence's beams share its encoder keys/values
(they are never copied per beam); sentences leave the batch when the host reads that they are
done (after every step on the CPU, every few steps on a GPU: `Finished` keeps the bookkeeping on
the device). A hypothesis's score is its log-probability divided by the GNMT length penalty
lp(Y) = ((5 + |Y|) / 6)^alpha, |Y| counting the EOS (or, with `lenpen_form` "length", by |Y|^alpha,
as Marian, transformers and CTranslate2 do).

A sentence is done when (a) `beam` hypotheses have finished (an EOS among the top `beam`
candidates of a step), or (b) `nbest` have finished and no live hypothesis can still beat the
nbest-th (its log-probability can only fall, and lp is largest at the maximum length), or (c)
the maximum length is reached. With `stopping` "heuristic" (transformers' default beam search,
with which released models are run), (a) becomes: `beam` hypotheses have finished and the best
live one, scored at its present length, does not beat the worst of them; the sentence then keeps
its `beam` best finished hypotheses. With `stopping` "onmt" (OpenNMT-py's beam search), a step's
candidates are its `beam` best only, so a hypothesis that finishes takes one of the live ones'
places; (a) becomes: the step's best candidate is EOS (and `nbest` have finished), and the
sentence keeps its `beam` best finished hypotheses. At the length limit (c) an output ends with
EOS at its own log-probability, or with `at_limit` "free" at none (transformers' forced EOS), or
with "cut" as it is: every one of the top `beam` candidates of the last step finishes, EOS or
not. With beam 1 this is greedy decoding.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from nmt_cli.config import SearchConfig
from nmt_cli.decode.constraints import Terms
from nmt_cli.decode.controls import OutputControls
from nmt_cli.decode.ensemble import Ensemble, OutputLayer
from nmt_cli.decode.incremental import DecoderState
from nmt_cli.device import steps_between_reads
from nmt_cli.text.vocab import BOS_ID, EOS_ID, PAD_ID


@dataclass
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    score: float  # log-probability / length penalty
    log_prob: float


def length_penalty(length: int | Tensor, alpha: float, form: str = "gnmt") -> float | Tensor:
    """GNMT length penalty ((5 + |Y|) / 6)^alpha (Wu et al., 2016), or with `form` "length" |Y|^alpha."""
    return (length if form == "length" else (5 + length) / 6) ** alpha


def penalty_of(config: SearchConfig) -> Callable[[Any], Any]:
    """The length penalty of an output of |Y| tokens (EOS included) under `config`'s --lenpen,
    --lenpen-form and --lenpen-start (with which |Y| counts the <s> too)."""
    return lambda length: length_penalty(length + config.lenpen_start, config.lenpen, config.lenpen_form)


def max_lengths(src_lengths: Tensor, config: SearchConfig, max_positions: int) -> Tensor:
    """Most output tokens (EOS excluded) per sentence: a * source tokens + b, at most --max-len and
    within the model's positions (bounded before the conversion to integers, which would overflow)."""
    longest = min(max_positions - 1, config.max_len or max_positions)
    return (config.max_len_a * src_lengths.double() + config.max_len_b).clamp(1, longest).long()


def forced_tokens(step: int, limits: Tensor, soonest_limit: int, prefixes: Tensor | None,
                  width: int) -> Tensor | None:
    """The token each decoder row must take at `step` (-1: any): its sentence's prefix token
    while in the prefix, EOS at its maximum length; None when no row is forced."""
    forced = prefixes[:, step] if prefixes is not None and step < prefixes.size(1) else None
    if step >= soonest_limit:
        free = forced if forced is not None else torch.full_like(limits, -1)
        forced = torch.where(limits == step, EOS_ID, free)
    return forced.repeat_interleave(width) if forced is not None else None


def output_limits(src: Tensor, prefixes: Tensor | None, config: SearchConfig, max_positions: int) -> Tensor:
    """Each sentence's most output tokens (`max_lengths`), with room for its prefix and at least
    one more token."""
    limits = max_lengths((src != PAD_ID).sum(1) - 1, config, max_positions)
    if prefixes is None:
        return limits
    return torch.maximum(limits, (prefixes >= 0).sum(1) + 1).clamp(max=max_positions - 1)


def heuristic(config: SearchConfig) -> bool:
    """Whether a sentence goes on after `beam` hypotheses finished (`stopping`; greedy never does)."""
    return config.stopping == "heuristic" and config.beam > 1


def keeps_best(config: SearchConfig) -> bool:
    """Whether a sentence keeps only its `beam` best finished hypotheses after each step (when it
    may finish more than `beam`)."""
    return config.stopping in ("heuristic", "onmt") and config.beam > 1


SHORT = 1e9  # ranks a hypothesis short of its constraints after those that hold them


class Finished:
    """The hypotheses each sentence of a search has finished, kept on the search's device so that
    a step reads nothing back to the host. A sentence has 2 * beam slots: it stops collecting
    once it holds `beam` (with the heuristic or onmt stopping, it keeps its `beam` best after
    each step), and one step adds at most `beam`. One more slot takes the writes of the
    candidates that did not finish. Scores are float64, as the host's floats were, so that the
    stopping test and the final order are those of a search kept on the host. A hypothesis that
    ended short of its constraints (at the length limit) ranks after every one that holds them."""

    def __init__(self, batch: int, beam: int, max_len: int, device: torch.device) -> None:
        self.spare = 2 * beam  # the slot that takes the writes of unfinished candidates
        self.count = torch.zeros(batch, dtype=torch.long, device=device)
        self.score = torch.full((batch, self.spare + 1), -math.inf, dtype=torch.float64, device=device)
        self.log_prob = torch.zeros_like(self.score)
        self.length = torch.zeros(batch, self.spare + 1, dtype=torch.long, device=device)
        self.tokens = torch.zeros(batch, self.spare + 1, max_len, dtype=torch.long, device=device)
        self.short = torch.zeros(batch, self.spare + 1, dtype=torch.bool, device=device)

    def add(self, sentences: Tensor, is_new: Tensor, log_probs: Tensor, tokens: Tensor, penalty: float,
            short: Tensor | None = None, lengths: Tensor | None = None) -> None:
        """Candidates `is_new` (sentences, beam) finish with `log_probs` and `tokens` (sentences,
        beam, step), each sentence's in order of rank; `sentences` are their sentence ids; `short`:
        those without all their constraints; `lengths`: how many of their `tokens` are theirs
        (default: all)."""
        slot = torch.where(is_new, self.count[sentences].unsqueeze(1) + is_new.cumsum(1) - 1, self.spare)
        where = (sentences.unsqueeze(1).expand_as(slot), slot)
        log_probs = log_probs.double()
        self.score.index_put_(where, log_probs / penalty)
        self.log_prob.index_put_(where, log_probs)
        self.length.index_put_(where, lengths if lengths is not None else
                               slot.new_full((), tokens.size(2)))  # not `= int`: a copy from the host
        self.tokens[:, :, : tokens.size(2)].index_put_(where, tokens)
        if short is not None:
            self.short.index_put_(where, short)
        self.count.index_add_(0, sentences, is_new.sum(1))

    def keep_best(self, beam: int) -> None:
        """Keep each sentence's `beam` best finished hypotheses (the earlier on equal scores), in
        its first slots: the rest are free for the next step's."""
        rank = self.score[:, : self.spare] - SHORT * self.short[:, : self.spare]
        order = rank.argsort(dim=1, descending=True, stable=True)
        kept, freed = order[:, :beam], order[:, beam:]
        for x in (self.score, self.log_prob, self.length, self.short):
            x[:, : self.spare] = torch.cat([x.gather(1, kept), x.gather(1, freed)], dim=1)
        index = torch.cat([kept, freed], dim=1).unsqueeze(2).expand(-1, -1, self.tokens.size(2))
        self.tokens[:, : self.spare] = self.tokens.gather(1, index)
        self.score[:, beam : self.spare] = -math.inf
        self.count.clamp_(max=beam)

    def done(self, sentences: Tensor, best_live: Tensor, bound: Tensor, present: float, config: SearchConfig,
             best_ended: Tensor) -> Tensor:
        """Whether each of `sentences` is done by (a) or (b) of the module docstring, given its
        best live log-probability, the length penalty of its longest output (`bound`), that of
        the live hypotheses' present length (`present`, for the heuristic (a)) and whether its
        step's best candidate finished (`best_ended`, for the onmt (a))."""
        count, best_live = self.count[sentences], best_live.double()
        nth_best = self.score[sentences, : self.spare].topk(config.nbest, dim=1).values[:, -1]
        full = count >= config.beam
        if config.stopping == "onmt":
            full = best_ended & (count >= config.nbest)
        elif heuristic(config):
            worst = self.score[sentences, : config.beam].min(dim=1).values
            full &= best_live / present <= worst
        return full | ((count >= config.nbest) & (best_live / bound <= nth_best))

    def hypotheses(self, nbest: int) -> list[list[Hypothesis]]:
        """Each sentence's `nbest` best hypotheses, best first (the earlier on equal scores): one
        read back to the host."""
        count, score, log_prob, length, tokens, short = (
            x.cpu() for x in (self.count, self.score, self.log_prob, self.length, self.tokens, self.short))
        out = []
        for s, n in enumerate(count.tolist()):
            found = list(zip(length[s, :n].tolist(), score[s, :n].tolist(), log_prob[s, :n].tolist(),
                             short[s, :n].tolist()))
            ranked = sorted(range(len(found)), key=lambda i: (found[i][3], -found[i][1]))
            out.append([Hypothesis(tokens[s, i, : found[i][0]].tolist(), found[i][1], found[i][2])
                        for i in ranked[:nbest]])
        return out


@dataclass
class Beams:
    """The live hypotheses of the sentences still in the batch, a sentence's rows together."""

    scores: Tensor  # (sentences, rows per sentence): log-probabilities
    history: Tensor  # (sentences * rows per sentence, step + 1): tokens, BOS first
    sentences: Tensor  # (sentences,): their ids in the batch
    limits: Tensor  # (sentences,): most output tokens
    bound: Tensor  # (sentences,): the length penalty of the longest output
    done: Tensor  # (sentences,): done at a step since the last read
    prefixes: Tensor | None
    host_limits: list[int]  # `limits` of the sentences on the host
    soonest_limit: int = field(init=False)  # the smallest of host_limits

    def __post_init__(self) -> None:
        self.soonest_limit = min(self.host_limits)

    def keep(self, rows: list[int], origin: Tensor) -> tuple[Tensor, Tensor]:
        """Keep only the sentences at `rows`; returns their index and their rows of `origin`."""
        index = torch.tensor(rows, device=self.scores.device)
        n, beam = self.scores.shape
        self.scores, self.sentences, self.limits, self.bound, self.done = (
            x[index] for x in (self.scores, self.sentences, self.limits, self.bound, self.done))
        self.history = self.history.view(n, beam, -1)[index].view(len(rows) * beam, -1)
        self.prefixes = self.prefixes[index] if self.prefixes is not None else None
        self.host_limits = [self.host_limits[r] for r in rows]
        self.soonest_limit = min(self.host_limits)
        return index, origin.view(n, beam)[index].view(-1)


def _best_candidates(models: Ensemble, states: list[DecoderState], beams: Beams, step: int, beam: int,
                     k: int, controls: OutputControls, terms: Terms | None,
                     layer: OutputLayer) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Each sentence's 2 * beam best one-token continuations, best first (with `terms`, in the
    order of dynamic beam allocation): their log-probabilities, rows (of the sentence), tokens and
    indices among the candidates."""
    n, width = beams.scores.shape
    forced = forced_tokens(step, beams.limits, beams.soonest_limit, beams.prefixes, width)
    # The best of a sentence's width * vocab candidates are among the k best tokens of each of its
    # rows: add the row scores to those only (not to every vocabulary entry).
    rules = terms.rules(beams.history, beams.sentences) if terms is not None else None
    token_lprobs, tokens = models.top_tokens(beams.history, states, k, controls, forced, rules, layer)
    per_row = token_lprobs.size(1)
    candidates = (beams.scores.unsqueeze(2) + token_lprobs.view(n, width, per_row)).view(n, -1)
    count = min(2 * beam, width * per_row)
    if terms is not None and terms.allocates:
        top_scores, top = terms.choose(candidates, tokens.view(n, -1), beams.sentences, count, beams.history[:, -1],
                                       beam // 2)
    else:
        top_scores, top = candidates.topk(count, dim=1)
    return top_scores, top // per_row, tokens.view(n, -1).gather(1, top), top


def _finish(finished: Finished, beams: Beams, step: int, candidates: tuple[Tensor, Tensor, Tensor, Tensor],
            is_eos: Tensor, penalty: float, config: SearchConfig, terms: Terms | None) -> Tensor:
    """Add to `finished` the `candidates` (`_best_candidates`, and which of them are EOS) that end
    at `step`, at the length `penalty` of that step: EOS among each sentence's top `beam`, of a
    sentence not done before; with `at_limit` "cut", every one of them at its sentence's last
    step (with its token when not EOS). `terms`: those of an allocating search. Returns whether
    each sentence's best candidate ended."""
    (n, width), cut = beams.scores.shape, config.at_limit == "cut"
    top_scores, top_row, top_token, top, is_eos = (x[:, : config.beam] for x in (*candidates, is_eos))
    ends = is_eos | (beams.limits - 1 == step).unsqueeze(1) if cut else is_eos
    is_new = ends & top_scores.isfinite() & ~beams.done.unsqueeze(1)
    ended = beams.history.view(n, width, -1)[torch.arange(n, device=top.device).unsqueeze(1), top_row, 1:]
    lengths = None
    if cut:
        ended, lengths = torch.cat([ended, top_token.unsqueeze(2)], 2), step + (~is_eos).long()
    short = terms.short(top, beams.sentences) if terms is not None else None
    finished.add(beams.sentences, is_new, top_scores, ended, penalty, short, lengths)
    return is_new[:, 0]


@torch.inference_mode()
def beam_search(models: Ensemble, src: Tensor, config: SearchConfig, prefixes: Tensor | None = None,
                terms: Terms | None = None, columns: Tensor | None = None) -> list[list[Hypothesis]]:
    """The `nbest` best hypotheses for each row of `src` (batch, src_len), best first; each
    starts with its row of `prefixes` (target ids, -1 after the end) when given, holds its
    sentence's `terms` (constraints.py), and has only tokens of a shortlist's `columns` when given.

    Every step's bookkeeping stays on the device; the host reads which sentences are done only
    every `device.steps_between_reads` steps, and then drops them from the batch (a sentence
    done meanwhile keeps decoding, and what it finds is ignored)."""
    batch, beam, device = src.size(0), config.beam, src.device
    limits = output_limits(src, prefixes, config, models.max_positions)
    limit = limits.tolist()
    # The first step has one row per sentence (all its beams would be the same BOS prefix); the
    # sentence's `beam` rows come from its best continuations. Not when the vocabulary cannot
    # fill a beam from one row, nor with graphs (whose rows are fixed).
    layer = models.output_layer(columns)
    k = min(2 * beam, layer.width)
    width = 1 if k >= beam and models.graphs is None else beam
    scores = torch.zeros(batch, width, device=device)
    scores[:, 1:] = -math.inf  # identical beams: expand the first only
    # A live hypothesis can beat a finished score only if its log-probability over the penalty of
    # its sentence's longest output does.
    penalty = penalty_of(config)
    bound = torch.tensor([penalty(n + 1) for n in limit], dtype=torch.float64, device=device)
    beams = Beams(scores, torch.full((batch * width, 1), BOS_ID, device=device), torch.arange(batch, device=device),
                  limits, bound, torch.zeros(batch, dtype=torch.bool, device=device), prefixes, limit)
    states = models.start(src, beam, max(limit) + 1)  # one encoder row per sentence, shared by its decoder rows
    finished = Finished(batch, beam, max(limit) + 1, device)
    controls, read_every = layer.controls(OutputControls.of(config, models.never, device)), steps_between_reads(device)
    allocating = terms is not None and terms.allocates  # the beam shared among banks (constraints.py)
    onmt, cut, free = config.stopping == "onmt", config.at_limit == "cut", config.at_limit == "free"
    if allocating:
        terms.start(batch, width)

    for step in range(max(limit) + 1):
        models.check_deadline()
        n, width = beams.scores.shape
        top_scores, top_row, top_token, top = _best_candidates(models, states, beams, step, beam, k, controls, terms,
                                                                     layer)
        is_eos = top_token == EOS_ID
        if free and step >= beams.soonest_limit:  # the forced EOS costs nothing
            at_limit = (beams.limits == step).unsqueeze(1) & is_eos
            top_scores = torch.where(at_limit, beams.scores.gather(1, top_row), top_scores)
        best_ended = _finish(finished, beams, step, (top_scores, top_row, top_token, top), is_eos, penalty(step + 1),
                             config, terms if allocating else None)
        if keeps_best(config):
            finished.keep_best(beam)
        # The first `beam` continuations that are not EOS (by score; with terms, by allocation);
        # with the onmt stopping, those among the first `beam` only (the others' rows are dead).
        order = -torch.arange(top.size(1), device=device, dtype=top_scores.dtype).expand_as(top_scores) \
            if allocating else top_scores
        unfit = is_eos
        if onmt:
            unfit = is_eos | (torch.arange(top.size(1), device=device) >= beam)
        live = order.masked_fill(unfit, -math.inf).topk(beam, dim=1)
        beams.scores = top_scores.gather(1, live.indices).masked_fill(live.values == -math.inf, -math.inf) \
            if allocating else live.values
        if allocating:
            terms.advance(top.gather(1, live.indices))
        origin = (torch.arange(n, device=device).unsqueeze(1) * width + top_row.gather(1, live.indices)).view(-1)
        beams.history = torch.cat([beams.history[origin], top_token.gather(1, live.indices).view(-1, 1)], dim=1)
        beams.done |= (beams.limits - int(cut) <= step) | finished.done(
            beams.sentences, beams.scores.max(dim=1).values, beams.bound, penalty(step + 1), config, best_ended)
        index = None
        if (step + 1) % read_every == 0:
            keep = [r for r, is_done in enumerate(beams.done.tolist()) if not is_done]
            if not keep:
                break
            if len(keep) < n:
                index, origin = beams.keep(keep, origin)
                if allocating:
                    terms.keep(index, beam)
        for state in states:
            state.reorder(origin, index)

    return finished.hypotheses(config.nbest)
