"""Terminology: lexically constrained beam search. Each sentence may carry phrases its output must
contain, in any order (positive constraints), and phrases it must not (`avoid`), as target ids.

Positive constraints follow dynamic beam allocation (Post & Vilar, 2018), vectorized as Hu et al.
(2019) do, inside the batched beam search: a hypothesis's progress is tensors (`met`: which of its
sentence's constraint tokens it has produced; `pos`: the next token of a phrase it has begun, or
-1), so sentences with different constraints search together and a step reads nothing back to
the host. Each step a row's candidates are its top-k tokens and the tokens that would advance its
constraints (`Terms.rules`); a candidate's bank is how many constraint tokens it has met, and the
beam is shared among the banks: the best of each bank first, from the fullest bank down, then the
second best of each, and so on (`Terms.choose`). A hypothesis cannot end (</s> is banned) before
it has met every constraint; at the length limit it ends anyway. A phrase begun and then left
counts as not met. A phrase to avoid has its last token banned wherever the output so far ends
with the rest of it (a one-token phrase: everywhere).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from nmt_cli.vocab import EOS_ID

NO_TOKEN = -1  # padding of the id tensors: no token (a wildcard in `avoid`'s left padding)
Phrases = tuple[list[list[list[int]]], list[list[list[int]]]]  # each sentence's phrases to include, to avoid


def _padded(rows: Sequence[Sequence[int]], width: int, device: torch.device) -> Tensor:
    out = torch.full((len(rows), max(width, 1)), NO_TOKEN, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out.to(device)


class Terms:
    """The constraints of a batch of sentences and the progress of each decoder row on them."""

    def __init__(self, include: Sequence[Sequence[Sequence[int]]], avoid: Sequence[Sequence[Sequence[int]]],
                 device: torch.device) -> None:
        """`include[s]`, `avoid[s]`: sentence s's phrases (lists of target ids) to produce, to avoid."""
        flat = [[t for phrase in phrases for t in phrase] for phrases in include]
        width = max(map(len, flat), default=0)
        self.tokens = _padded(flat, width, device)  # (sentences, T): the phrases back to back
        self.phrase = _padded([[j for j, phrase in enumerate(phrases) for _ in phrase] for phrases in include],
                              width, device)
        self.last = _padded([[int(i == len(phrase) - 1) for phrase in phrases for i in range(len(phrase))]
                             for phrases in include], width, device) == 1
        self.first = _padded([[int(i == 0) for phrase in phrases for i in range(len(phrase))]
                              for phrases in include], width, device) == 1
        self.needed = (self.tokens != NO_TOKEN).sum(1)  # (sentences,)
        self.allocates = width > 0  # a phrase to produce: the beam is allocated by bank, else by score alone
        longest = max((len(p) for phrases in avoid for p in phrases), default=0)
        self.avoid = torch.stack([_padded([[NO_TOKEN] * (longest - len(p)) + list(p) for p in phrases], longest,
                                          device) for phrases in _same_count(avoid)]) if longest else None
        self.met = torch.zeros(0, self.tokens.size(1), dtype=torch.bool, device=device)  # (rows, T)
        self.pos = torch.zeros(0, dtype=torch.long, device=device)  # (rows,)
        self.candidates: tuple[Tensor, Tensor] | None = None

    def start(self, sentences: int, width: int) -> None:
        """Rows of a search's first step: `width` per sentence, none begun."""
        self.met = torch.zeros(sentences * width, self.tokens.size(1), dtype=torch.bool, device=self.tokens.device)
        self.pos = torch.full((sentences * width,), NO_TOKEN, dtype=torch.long, device=self.tokens.device)

    def rules(self, history: Tensor, sentences: Tensor) -> tuple[Tensor, Tensor]:
        """For each row (its `history`, BOS first; `sentences`: the batch's sentence ids of the
        rows' sentences): the tokens it may not take (-1: none), and the tokens that would advance
        its constraints (-1: none), to be candidates whatever their rank."""
        rows = history.size(0)
        sentence = sentences.repeat_interleave(rows // sentences.size(0))
        banned = [] if self.avoid is None else [_avoided(self.avoid[sentence], history[:, 1:])]
        none = torch.empty(rows, 0, dtype=torch.long, device=history.device)
        if not self.allocates:
            return torch.cat([none, *banned], 1), none
        incomplete = self.met.sum(1) < self.needed[sentence]
        banned.append(torch.where(incomplete, EOS_ID, NO_TOKEN).unsqueeze(1))
        tokens = self.tokens[sentence]
        begun = self.pos >= 0
        following = tokens.gather(1, self.pos.clamp(min=0).unsqueeze(1))
        startable = self.first[sentence] & ~self.met & (tokens != NO_TOKEN)
        wanted = torch.where(begun.unsqueeze(1), torch.cat([following, torch.full_like(tokens[:, 1:], NO_TOKEN)], 1),
                             tokens.masked_fill(~startable, NO_TOKEN))
        return torch.cat(banned, 1), wanted

    def choose(self, candidates: Tensor, tokens: Tensor, sentences: Tensor, count: int) -> tuple[Tensor, Tensor]:
        """The `count` candidates (n, width * per_row scores `candidates`, ids `tokens`) that each
        sentence's beam takes, in the order of dynamic beam allocation: their scores and indices."""
        n, total = candidates.shape
        width = self.met.size(0) // n
        parent = torch.arange(total, device=tokens.device) // (total // width)
        met = self.met.view(n, width, -1)[:, parent]  # (n, total, T)
        pos = self.pos.view(n, width)[:, parent]
        met, pos = self._advance(met, pos, tokens, sentences)
        self.candidates = (met, pos)
        bank = met.sum(-1)  # (n, total)
        banks = self.tokens.size(1) + 1
        order = candidates.argsort(dim=1, descending=True, stable=True)
        in_bank = torch.nn.functional.one_hot(bank.gather(1, order), banks)
        rank = torch.empty_like(order).scatter_(1, order, ((in_bank.cumsum(1) * in_bank).sum(-1) - 1))
        priority = (rank * banks + (banks - 1 - bank)).masked_fill(candidates == -math.inf, n * total * banks)
        top = priority.topk(count, dim=1, largest=False).indices
        return candidates.gather(1, top), top

    def short(self, chosen: Tensor, sentences: Tensor) -> Tensor:
        """Whether each of the `chosen` candidates (n, c) of the last `choose` lacks a constraint."""
        met, _ = self.candidates
        rows = torch.arange(chosen.size(0), device=chosen.device).unsqueeze(1)
        return met[rows, chosen].sum(-1) < self.needed[sentences].unsqueeze(1)

    def advance(self, chosen: Tensor) -> None:
        """The rows become the `chosen` candidates (n, beam) of the last `choose`."""
        met, pos = self.candidates
        n = chosen.size(0)
        rows = torch.arange(n, device=chosen.device).unsqueeze(1)
        self.met, self.pos = met[rows, chosen].flatten(0, 1), pos[rows, chosen].flatten()

    def keep(self, index: Tensor, width: int) -> None:
        """Keep the rows (`width` per sentence) of the sentences at `index` (those still searching)."""
        self.met = self.met.view(-1, width, self.met.size(1))[index].flatten(0, 1)
        self.pos = self.pos.view(-1, width)[index].flatten()

    def _advance(self, met: Tensor, pos: Tensor, tokens: Tensor, sentences: Tensor) -> tuple[Tensor, Tensor]:
        """The progress (met (n, c, T), pos (n, c)) after each candidate's token (n, c)."""
        ids = self.tokens[sentences].unsqueeze(1)  # (n, 1, T)
        phrase, first, last = (x[sentences].unsqueeze(1) for x in (self.phrase, self.first, self.last))
        begun = pos >= 0
        at = pos.clamp(min=0).unsqueeze(2)
        continues = begun & (ids.expand_as(met).gather(2, at).squeeze(2) == tokens)
        # a phrase begun and left: its tokens are not met
        left = begun & ~continues
        current = phrase.expand_as(met).gather(2, at)
        met = met & ~(left.unsqueeze(2) & (phrase == current))
        # a token that begins a phrase not met (when none is under way): the first such phrase
        starts = ~(begun & continues).unsqueeze(2) & first & ~met & (ids == tokens.unsqueeze(2))
        has_start = starts.any(2)
        where = torch.where(continues, pos, starts.int().argmax(2))
        step = continues | has_start
        met = met | (step.unsqueeze(2) & (torch.arange(met.size(2), device=met.device) == where.unsqueeze(2)))
        ends = last.expand_as(met).gather(2, where.clamp(min=0).unsqueeze(2)).squeeze(2)
        pos = torch.where(step & ~ends, where + 1, NO_TOKEN)
        return met, pos


def _same_count(avoid: Sequence[Sequence[Sequence[int]]]) -> list[list[Sequence[int]]]:
    """Each sentence's phrases to avoid, padded with empty phrases to the same number."""
    most = max(map(len, avoid), default=0)
    return [list(phrases) + [[]] * (most - len(phrases)) for phrases in avoid]


def _avoided(avoid: Tensor, output: Tensor) -> Tensor:
    """(rows, A): the last token of each phrase to avoid (rows, A, L; left-padded with -1) whose
    other tokens end the row's `output` (-1 where not)."""
    rows, _, longest = avoid.shape
    tail = torch.full((rows, longest - 1), -2, dtype=output.dtype, device=output.device)  # -2: before the output
    kept = min(longest - 1, output.size(1))
    if kept:
        tail[:, longest - 1 - kept:] = output[:, output.size(1) - kept:]
    before = avoid[:, :, :-1]
    follows = ((before == NO_TOKEN) | (before == tail.unsqueeze(1))).all(2)
    return torch.where(follows, avoid[:, :, -1], NO_TOKEN)
