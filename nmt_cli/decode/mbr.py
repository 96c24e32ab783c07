"""Minimum Bayes risk decoding (--mbr N; Kumar & Byrne, 2004; Eikema & Aziz, 2020; Freitag et
al., 2022): of a sentence's N candidates, the one that agrees most with the others, each of them
taken in turn as the reference: argmax_i mean_{j != i} u(c_i, c_j), the utility u a sentence-level
chrF or BLEU exactly as sacreBLEU computes it (sentence_chrf, sentence_bleu). Each candidate's
n-grams are counted once, not once per pair, and what two candidates share once for both ways:
the N(N-1)/2 pairs cost only their matching."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any, Protocol

from sacrebleu.metrics.bleu import BLEU
from sacrebleu.metrics.helpers import extract_all_char_ngrams, extract_all_word_ngrams
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a


class Utility(Protocol):
    def features(self, text: str) -> Any:
        """What the utility needs of a text, counted once."""

    def matches(self, one: Any, other: Any) -> list[int]:
        """The n-grams two texts share (their features), per order, clipped: the same both ways."""

    def score(self, matches: list[int], hypothesis: Any, reference: Any) -> float:
        """The utility of a hypothesis against a reference (their features, their `matches`), 0-100."""


def shared(one: Counter, other: Counter) -> int:
    """How many n-grams two counts share, clipped."""
    if len(other) < len(one):
        one, other = other, one
    return sum(min(count, other[gram]) for gram, count in one.items() if gram in other)


class Chrf:
    """sacreBLEU's chrF (its defaults: character n-grams up to 6, beta 2, whitespace left out;
    Popović, 2015)."""

    order, beta = 6, 2

    def features(self, text: str) -> list[tuple[Counter, int]]:
        return [(grams, grams.total()) for grams in extract_all_char_ngrams(text, self.order)]

    def matches(self, one: list[tuple[Counter, int]], other: list[tuple[Counter, int]]) -> list[int]:
        return [shared(a, b) for (a, _), (b, _) in zip(one, other)]

    def score(self, matches: list[int], hypothesis: list[tuple[Counter, int]],
              reference: list[tuple[Counter, int]]) -> float:
        factor = self.beta ** 2
        precision = recall = 0.0
        orders = 0  # the orders both sides have n-grams of (sacreBLEU's effective order)
        for match, (_, hyp), (_, ref) in zip(matches, hypothesis, reference):
            if hyp and ref:
                precision += match / hyp
                recall += match / ref
                orders += 1
        if not orders or not precision + recall:
            return 0.0
        precision, recall = precision / orders, recall / orders
        f = (1 + factor) * precision * recall / (factor * precision + recall)  # sacreBLEU's order of operations
        return 100 * f


class Bleu:
    """sacreBLEU's sentence BLEU (13a tokens, 4-grams, exponential smoothing, effective order)."""

    order = 4

    def __init__(self) -> None:
        self.tokenize = Tokenizer13a()

    def features(self, text: str) -> tuple[list[Counter], list[int], int]:
        """The 13a tokens' n-grams by order, how many of each order, and how many tokens."""
        grams, length = extract_all_word_ngrams(self.tokenize(text.rstrip()), 1, self.order)
        by_order: list[Counter] = [Counter() for _ in range(self.order)]
        for gram, count in grams.items():
            by_order[len(gram) - 1][gram] = count
        return by_order, [each.total() for each in by_order], length

    def matches(self, one: tuple[list[Counter], list[int], int], other: tuple[list[Counter], list[int], int]
                ) -> list[int]:
        return [shared(a, b) for a, b in zip(one[0], other[0])]

    def score(self, matches: list[int], hypothesis: tuple[list[Counter], list[int], int],
              reference: tuple[list[Counter], list[int], int]) -> float:
        return BLEU.compute_bleu(list(matches), list(hypothesis[1]), hypothesis[2], reference[2], smooth_method="exp",
                                 effective_order=True).score


def utility(name: str) -> Utility:
    """The utility of --mbr-utility `name`."""
    return {"chrf": Chrf, "bleu": Bleu}[name]()


def expected_utilities(texts: list[str], u: Utility) -> list[float]:
    """Each candidate's mean utility against the other candidates, each weighted equally (a
    candidate drawn twice counts twice); a lone candidate's is 0."""
    features = [u.features(text) for text in texts]
    total = [0.0] * len(texts)
    for i, j in itertools.combinations(range(len(texts)), 2):
        both = u.matches(features[i], features[j])
        total[i] += u.score(both, features[i], features[j])
        total[j] += u.score(both, features[j], features[i])
    return [t / max(len(texts) - 1, 1) for t in total]


def ranking(texts: list[str], u: Utility) -> list[int]:
    """The candidates' indices, highest expected utility first; a tie goes to the candidate given
    first (the better-ranked by the search)."""
    expected = expected_utilities(texts, u)
    return sorted(range(len(texts)), key=lambda i: -expected[i])
