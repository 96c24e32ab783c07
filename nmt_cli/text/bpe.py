"""Learning joint BPE (Sennrich et al., 2016): the merge operations subword-nmt's `learn-bpe`
would write for the same word counts, found without a pass over all pairs at every merge."""

from __future__ import annotations

import heapq
import sys
from collections import Counter, defaultdict
from collections.abc import Mapping

from tqdm import tqdm

from nmt_cli.errors import NmtError

Pair = tuple[str, str]


class PairCounts:
    """How often each pair of adjacent symbols occurs, with the pairs grouped by count, so the most
    frequent pair is found without a pass over all of them."""

    def __init__(self) -> None:
        self.count: dict[Pair, int] = {}
        self.by_count: dict[int, set[Pair]] = defaultdict(set)
        self.heap: list[int] = []  # negated counts that have (or had) pairs; stale entries are skipped

    def add(self, pair: Pair, delta: int) -> None:
        old = self.count.get(pair, 0)
        new = old + delta
        if old:
            group = self.by_count[old]
            group.discard(pair)
            if not group:
                del self.by_count[old]
        if new > 0:
            if new not in self.by_count:
                heapq.heappush(self.heap, -new)
            self.by_count[new].add(pair)
            self.count[pair] = new
        else:
            self.count.pop(pair, None)

    def most_frequent(self) -> tuple[Pair, int] | None:
        """The most frequent pair, ties going to the larger pair (as subword-nmt breaks them)."""
        while self.heap and -self.heap[0] not in self.by_count:
            heapq.heappop(self.heap)
        if not self.heap:
            return None
        count = -self.heap[0]
        return max(self.by_count[count]), count


def merge_pair(word: list[str], pair: Pair) -> list[str]:
    """`word` with every occurrence of `pair` joined into one symbol, left to right ("a a a" -> "aa a")."""
    first, second = pair
    merged: list[str] = []
    k = 0
    while True:
        try:
            j = word.index(first, k)
        except ValueError:
            break
        if j + 1 < len(word) and word[j + 1] == second:
            merged += word[k:j]
            merged.append(first + second)
            k = j + 2
        else:
            merged += word[k : j + 1]
            k = j + 1
    merged += word[k:]
    return merged


def learn_bpe(word_counts: Mapping[str, int], merges: int, min_frequency: int = 2, progress: bool = False) -> str:
    """BPE merge operations learned from word counts (Sennrich et al., 2016, Algorithm 1; for joint
    BPE, the counts of both languages together), written as subword-nmt's `learn-bpe` writes them
    (format 0.2: "</w>" is joined to a word's last character).

    Each step merges the most frequent pair of adjacent symbols everywhere, ties going to the larger
    pair; it stops early when no pair occurs `min_frequency` times. Only the words holding the
    merged pair are visited again, and the pairs are kept grouped by count, so a step does not
    look at every pair, as subword-nmt's maximum over all its pair statistics does (the learn_bpe
    stage of tests/benchmarks/preprocess_speed.py measures it). The codes are subword-nmt's
    (tests/text/test_bpe.py compares them).
    """
    if not any(len(word) > 1 for word in word_counts):
        raise NmtError("no BPE merge can be learned: every training word is one character (use --bpe-merges 0)")
    entries = [(word, count) for word, count in word_counts.items() if word]
    words = [[*word[:-1], word[-1] + "</w>"] for word, _ in entries]
    freqs = [count for _, count in entries]
    holders: dict[Pair, set[int]] = defaultdict(set)  # the words each pair occurs (or occurred) in
    initial: Counter[Pair] = Counter()
    for i, (word, freq) in enumerate(zip(words, freqs)):
        for pair in zip(word, word[1:]):
            initial[pair] += freq
            holders[pair].add(i)
    pairs = PairCounts()
    for pair, count in initial.items():
        pairs.add(pair, count)
    codes = ["#version: 0.2\n"]
    for _ in tqdm(range(merges), desc="learn BPE", unit="merge", disable=not progress, file=sys.stderr):
        best = pairs.most_frequent()
        if best is None or best[1] < min_frequency:
            break
        pair = best[0]
        codes.append(f"{pair[0]} {pair[1]}\n")
        change: Counter[Pair] = Counter()
        for i in holders.pop(pair):
            old = words[i]
            new = merge_pair(old, pair)
            if len(new) == len(old):  # the pair left this word with an earlier merge
                continue
            for gone in zip(old, old[1:]):
                change[gone] -= freqs[i]
            for added in zip(new, new[1:]):
                change[added] += freqs[i]
                holders[added].add(i)
            words[i] = new
        for changed, delta in change.items():  # the merged pair's count falls to 0
            if delta:
                pairs.add(changed, delta)
    return "".join(codes)
