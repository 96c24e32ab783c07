"""Terminology: lexically constrained beam search. Each sentence may carry phrases its output must
hold, in any order (positive constraints), and phrases it must not (`avoid`), as target ids.

Positive constraints follow dynamic beam allocation (Post & Vilar, 2018), vectorized as Hu et al.
(2019) do, inside the batched beam search: a hypothesis's progress is tensors (`done`: the phrases
it holds; `ends`: which beginnings of each phrase its output ends with, so phrases that begin
alike are followed together), so sentences with different constraints search together and a step
reads nothing back to the host. A phrase begins only where a word does (not after BPE's @@), as
in running text. Each step a row's candidates are its top-k tokens and the tokens that would
advance its phrases (`Terms.rules`); a candidate's bank counts the tokens of the phrases it holds
and of the longest one it has begun. The beam takes the best half of the candidates by score
(so the unconstrained search's path stays), then the rest by bank: the best of each bank first,
from the fullest bank down, then the second best of each, and so on (`Terms.choose`). A
hypothesis cannot end (</s> is banned) before it holds every phrase; at the length limit it ends
anyway, and ranks after those that hold them (search.Finished). A phrase to avoid has its last
token banned wherever the output so far ends with the rest of it (a one-token phrase: everywhere).
Sharing the beam can change an output that held its phrases anyway: `holds` is the check by which
--plain-first keeps such an output and searches only the others with their phrases (generator.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from nmt_cli.corpus.data import pad
from nmt_cli.text.vocab import EOS_ID

NO_TOKEN = -1  # padding of the id tensors: no token (a wildcard in `avoid`'s left padding)
Phrases = tuple[list[list[list[int]]], list[list[list[int]]]]  # each sentence's phrases to include, to avoid


def _phrases(per_sentence: Sequence[Sequence[Sequence[int]]], device: torch.device,
             right_aligned: bool = False) -> Tensor:
    """(sentences, P, L) ids: each sentence's phrases, as many for each (empty ones added), padded
    with NO_TOKEN (on the left where `right_aligned`)."""
    same = _same_count(per_sentence)
    longest = max((len(p) for phrases in same for p in phrases), default=0)
    rows = [np.array(([NO_TOKEN] * (longest - len(p)) if right_aligned else []) + list(p), dtype=np.int64)
            for phrases in same for p in phrases]
    if not rows:
        return torch.full((len(same), 0, 1), NO_TOKEN, dtype=torch.long, device=device)
    return pad(rows, value=NO_TOKEN, length=max(longest, 1)).view(len(same), len(same[0]), -1).to(device)


class Terms:
    """The constraints of a batch of sentences and the progress of each decoder row on them."""

    def __init__(self, include: Sequence[Sequence[Sequence[int]]], avoid: Sequence[Sequence[Sequence[int]]],
                 device: torch.device, joining: Tensor | None = None) -> None:
        """`include[s]`, `avoid[s]`: sentence s's phrases (lists of target ids) to produce, to avoid;
        `joining`: which target ids go on into the next token's word (BPE's @@): a phrase begins
        only where a word does, as in running text."""
        self.joining = joining
        self.words = _phrases(include, device)  # (sentences, P, L)
        self.length = (self.words != NO_TOKEN).sum(2)  # (sentences, P)
        most = self.words.size(1)
        self.allocates = most > 0  # a phrase to produce: the beam is allocated by bank, else by score alone
        self.avoid = _phrases(avoid, device, right_aligned=True) if any(map(any, avoid)) else None
        # per row: which phrases it holds (rows, P), and which of their beginnings its output ends
        # with (rows, P, L: [..., i] the first i + 1 tokens)
        self.done = torch.zeros(0, most, dtype=torch.bool, device=device)
        self.ends = torch.zeros(0, most, self.words.size(2), dtype=torch.bool, device=device)
        self.candidates: tuple[Tensor, Tensor] | None = None

    def start(self, sentences: int, width: int) -> None:
        """Rows of a search's first step: `width` per sentence, nothing produced."""
        self.done = self.done.new_zeros(sentences * width, self.words.size(1))
        self.ends = self.ends.new_zeros(sentences * width, *self.words.shape[1:])

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
        words, length = self.words[sentence], self.length[sentence]
        incomplete = (~self.done & (length > 0)).any(1)
        banned.append(torch.where(incomplete, EOS_ID, NO_TOKEN).unsqueeze(1))
        begun = self._progress(self.ends)  # (rows, P): the longest beginning of each phrase the output ends with
        wanted = words.gather(2, begun.clamp(max=words.size(2) - 1).unsqueeze(2)).squeeze(2)
        may = ~self.done & (begun < length) & ((begun > 0) | self._word_starts(history[:, -1:]))
        return torch.cat(banned, 1), wanted.masked_fill(~may, NO_TOKEN)

    def choose(self, candidates: Tensor, tokens: Tensor, sentences: Tensor, count: int, last: Tensor,
               keep: int) -> tuple[Tensor, Tensor]:
        """The `count` candidates (n, width * per_row scores `candidates`, ids `tokens`; `last`:
        each row's last token) that each sentence's beam takes, in order: the `keep` best by score,
        then the others in the order of dynamic beam allocation: their scores and indices."""
        n, total = candidates.shape
        width = self.done.size(0) // n
        parent = torch.arange(total, device=tokens.device) // (total // width)
        done = self.done.view(n, width, -1)[:, parent]  # (n, total, P)
        ends = self.ends.view(n, width, *self.ends.shape[1:])[:, parent]  # (n, total, P, L)
        done, ends = self._advance(done, ends, tokens, sentences, self._word_starts(last.view(n, width)[:, parent]))
        self.candidates = (done, ends)
        length = self.length[sentences].unsqueeze(1)
        bank = self.produced(done, ends, length)
        banks = int(self.words.size(1) * self.words.size(2)) + 1
        order = candidates.argsort(dim=1, descending=True, stable=True)
        in_bank = torch.nn.functional.one_hot(bank.gather(1, order), banks)
        rank = torch.empty_like(order).scatter_(1, order, ((in_bank.cumsum(1) * in_bank).sum(-1) - 1))
        priority = (rank * banks + (banks - 1 - bank)).masked_fill(candidates == -math.inf, n * total * banks)
        # the best `keep` by score first, whatever their banks: the path of the unconstrained search
        # stays in the beam, so that an output that holds its phrases anyway is not lost
        best = torch.empty_like(order).scatter_(1, order, torch.arange(total, device=order.device).expand_as(order))
        priority = torch.where(best < keep, best - keep, priority)
        top = priority.topk(count, dim=1, largest=False).indices
        return candidates.gather(1, top), top

    def short(self, chosen: Tensor, sentences: Tensor) -> Tensor:
        """Whether each of the `chosen` candidates (n, c) of the last `choose` lacks a phrase."""
        done, _ = self.candidates
        rows = torch.arange(chosen.size(0), device=chosen.device).unsqueeze(1)
        return (~done[rows, chosen] & (self.length[sentences].unsqueeze(1) > 0)).any(-1)

    def advance(self, chosen: Tensor) -> None:
        """The rows become the `chosen` candidates (n, beam) of the last `choose`."""
        done, ends = self.candidates
        rows = torch.arange(chosen.size(0), device=chosen.device).unsqueeze(1)
        self.done, self.ends = done[rows, chosen].flatten(0, 1), ends[rows, chosen].flatten(0, 1)

    def keep(self, index: Tensor, width: int) -> None:
        """Keep the rows (`width` per sentence) of the sentences at `index` (those still searching)."""
        self.done = self.done.view(-1, width, self.done.size(1))[index].flatten(0, 1)
        self.ends = self.ends.view(-1, width, *self.ends.shape[1:])[index].flatten(0, 1)

    @classmethod
    def produced(cls, done: Tensor, ends: Tensor, length: Tensor) -> Tensor:
        """A hypothesis's bank: the tokens of the phrases it holds, and of the longest beginning of
        one it does not that it ends with (phrases that begin alike count once)."""
        return (done * length).sum(-1) + cls._progress(ends).masked_fill(done, 0).amax(-1)

    def _word_starts(self, last: Tensor) -> Tensor:
        """Whether a token after `last` begins a word (`last` with a trailing dimension of 1)."""
        return torch.ones_like(last, dtype=torch.bool) if self.joining is None else ~self.joining[last]

    @staticmethod
    def _progress(ends: Tensor) -> Tensor:
        """The length of the longest beginning of each phrase that the output ends with (..., P)."""
        lengths = torch.arange(1, ends.size(-1) + 1, device=ends.device)
        return (ends * lengths).amax(-1)

    def _advance(self, done: Tensor, ends: Tensor, tokens: Tensor, sentences: Tensor,
                 word_starts: Tensor) -> tuple[Tensor, Tensor]:
        """The progress (done (n, c, P), ends (n, c, P, L)) after each candidate's token (n, c),
        which begins a word where `word_starts` (n, c): a phrase's beginning of i + 1 tokens is
        where its first i were and the token is its next (the first one: where a word begins)."""
        words = self.words[sentences].unsqueeze(1)  # (n, 1, P, L)
        before = torch.cat([word_starts[..., None, None].expand(*ends.shape[:-1], 1), ends[..., :-1]], -1)
        ends = before & (words == tokens[..., None, None])
        whole = ends.gather(-1, (self.length[sentences] - 1).clamp(min=0)[:, None, :, None].expand(
            *ends.shape[:-1], 1)).squeeze(-1)
        return done | (whole & (self.length[sentences].unsqueeze(1) > 0)), ends


def holds(output: Sequence[int], include: Sequence[Sequence[int]], avoid: Sequence[Sequence[int]],
          joining: Tensor | None = None) -> bool:
    """Whether `output` (target ids) is what a search with these phrases asks for: every phrase to
    `include` in it, beginning where a word does (not after a `joining` id, as in `Terms`), and no
    phrase to `avoid`."""
    ends_word = [True] * len(output) if joining is None else (~joining[list(output)]).tolist()
    begins_word = [True, *ends_word]
    return all(any(begins_word[i] for i in positions(p, output)) for p in include if p) and \
        not any(positions(p, output) for p in avoid if p)


def positions(phrase: Sequence[int], ids: Sequence[int]) -> list[int]:
    """Where `phrase` begins in `ids` (token ids)."""
    n = len(phrase)
    return [i for i in range(len(ids) - n + 1) if list(ids[i:i + n]) == list(phrase)]


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
