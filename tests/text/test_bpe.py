"""bpe.py: the codes subword-nmt would learn, on real Multi30k words and on tie-heavy ones."""

import contextlib
import io
import random
from collections import Counter

import pytest
from conftest import head
from subword_nmt.learn_bpe import learn_bpe as subword_nmt_learn_bpe

from nmt_cli.errors import NmtError
from nmt_cli.text.bpe import learn_bpe, merge_pair


def subword_nmt_codes(word_counts: Counter, merges: int) -> str:
    codes = io.StringIO()
    with contextlib.redirect_stderr(io.StringIO()):  # its progress bar
        subword_nmt_learn_bpe([f"{w} {c}" for w, c in word_counts.items()], codes, merges, is_dict=True)
    return codes.getvalue()


@pytest.mark.slow
def test_learned_codes_are_subword_nmts(multi30k):
    """The same merges in the same order as subword-nmt's learn-bpe: on real text, and on words of
    two letters whose pairs tie all the time, run until no pair occurs twice."""
    words = Counter(w for lang in ("en", "de") for line in head(multi30k / f"train.{lang}", 3000) for w in line.split())
    assert learn_bpe(words, 1500) == subword_nmt_codes(words, 1500)
    for seed in range(3):
        rng = random.Random(seed)
        ties = Counter({"".join(rng.choice("aab") for _ in range(rng.randint(1, 9))): rng.randint(1, 4)
                        for _ in range(500)})
        codes = learn_bpe(ties, 10_000)
        assert codes == subword_nmt_codes(ties, 10_000)
        assert len(codes.splitlines()) - 1 < 10_000  # stopped because no pair occurs twice


def test_bpe_merges_by_hand():
    # "a a a</w>": the pairs (a, a) and (a, a</w>) both occur twice; the larger pair wins the tie
    assert learn_bpe(Counter({"aaa": 2}), 10) == "#version: 0.2\na a</w>\na aa</w>\n"
    assert learn_bpe(Counter({"ab": 1, "cd": 1}), 10) == "#version: 0.2\n"  # no pair occurs twice
    with pytest.raises(NmtError, match="every training word is one character"):
        learn_bpe(Counter({"a": 3, "b": 1}), 10)
    assert merge_pair(["a", "a", "a", "a</w>"], ("a", "a")) == ["aa", "a", "a</w>"]  # left to right
    assert merge_pair(["b", "a", "b", "a"], ("b", "a")) == ["ba", "ba"]
