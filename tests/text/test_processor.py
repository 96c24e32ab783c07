"""Tokenization and BPE, and the way back, on real Multi30k lines."""

from collections import Counter

import pytest
from conftest import head

from nmt_cli.config import TextConfig
from nmt_cli.text.bpe import learn_bpe
from nmt_cli.text.processor import TextProcessor, subword_counts
from nmt_cli.text.vocab import Vocabulary


@pytest.mark.slow
def test_round_trip_on_multi30k(multi30k):
    config = TextConfig("en", "de")
    for lang in ("en", "de"):
        lines = head(multi30k / f"train.{lang}", 2000)
        plain = TextProcessor(config, lang)
        words = Counter(w for line in lines for w in plain.tokenize(line))
        processor = TextProcessor(config, lang, learn_bpe(words, 500))
        vocab = Vocabulary.build(subword_counts(processor, words))
        exact = 0
        for line in lines:
            tokens = processor.encode(line)
            back = processor.decode(vocab.decode(vocab.encode(tokens)))
            normalized = plain.normalizer.normalize(line)
            assert back.split() == normalized.split() or back.replace(" ", "") == normalized.replace(" ", "")
            exact += back == normalized
        # Moses detokenization differs in spacing on a few lines ("Disney's", "\"Open\"-Anzeige").
        assert exact >= 0.99 * len(lines)
        # BPE really split words: 500 merges cannot cover this vocabulary.
        assert sum(len(processor.encode(line)) for line in lines) > sum(len(plain.tokenize(line)) for line in lines)


def test_subword_counts_equal_counting_the_segmented_corpus(multi30k):
    config = TextConfig("en", "de")
    lines = head(multi30k / "train.de", 300)
    plain = TextProcessor(config, "de")
    words = Counter(w for line in lines for w in plain.tokenize(line))
    processor = TextProcessor(config, "de", learn_bpe(words, 200))
    direct = Counter(t for line in lines for t in processor.encode(line))
    assert subword_counts(processor, words) == direct


def test_whitespace_tokenizer_for_any_task():
    config = TextConfig("src", "tgt", tokenizer="none")
    processor = TextProcessor(config, "src")
    assert processor.tokenize("  a  b\tc ") == ["a", "b", "c"]
    assert processor.decode(["a", "b"]) == "a b"


def test_lowercase_and_dash_splits():
    config = TextConfig("en", "de", lowercase=True, aggressive_dash_splits=True)
    processor = TextProcessor(config, "en")
    assert processor.tokenize("A well-known Dog.") == ["a", "well", "@-@", "known", "dog", "."]
    assert processor.decode(["well", "@-@", "known"]) == "well-known"


def test_escaping_as_fairseqs_moses_tokenizer_and_back():
    processor = TextProcessor(TextConfig("en", "de", escape=True), "en")
    assert processor.tokenize('a woman\'s "R&B"') == ["a", "woman", "&apos;s", "&quot;", "R", "&amp;", "B", "&quot;"]
    assert processor.decode(["a", "woman", "&apos;s", "R", "&amp;", "B"]) == "a woman's R & B"
    assert TextProcessor(TextConfig("en", "de"), "en").tokenize("woman's") == ["woman", "'s"]


def test_bpe_removal_joins_subwords():
    processor = TextProcessor(TextConfig("en", "de"), "en")
    assert processor.decode(["Bu@@", "shes", "are", "gre@@", "en@@"]) == "Bushes are green"


def test_segmentations_made_by_one_processor_are_adopted_by_another(multi30k):
    config = TextConfig("en", "de")
    plain = TextProcessor(config, "en")
    words = sorted({w for line in head(multi30k / "train.en", 300) for w in plain.tokenize(line)})
    codes = learn_bpe(Counter(words), 200)
    worker, parent = TextProcessor(config, "en", codes), TextProcessor(config, "en", codes)
    made = worker.segmentations(words)
    assert set(made) == {w for w in words if len(w) > 1}
    parent.adopt(made)
    assert parent.segment(words) == worker.segment(words)
    parent.adopt({"dog": ("d", "og")})  # what is adopted is what segment() returns
    assert parent.segment(["dog", "a"]) == ["d@@", "og", "a"]


TAGGED = "<2de> <BT> A man, in a red (bright) shirt: <sep> rides a bike!"


def test_tags_pass_tokenization_lowercasing_and_bpe_whole():
    words = Counter({w: 5 for w in "a man in red shirt rides bike < 2de > sep bt BT".split()})
    codes = learn_bpe(words, 40)  # merges that would also join the pieces of a split tag
    for config in (TextConfig("en", "de", lowercase=True), TextConfig("en", "de", tokenizer="none", lowercase=True)):
        tokens = TextProcessor(config, "en", codes).encode(TAGGED)
        assert tokens[:2] == ["<2de>", "<BT>"] and "<sep>" in tokens, tokens
        assert "man" in " ".join(tokens).replace("@@ ", "")  # the rest is lowercased and segmented as before
    off = TextProcessor(TextConfig("en", "de", protect_tags=False), "en").tokenize(TAGGED)
    assert off[:3] == ["<", "2de", ">"]


def test_user_patterns_are_protected_and_checked():
    config = TextConfig("en", "de", protect=(r"https?://\S+",))
    words = TextProcessor(config, "en").tokenize("see https://example.org/a-b?c=d, <2de> now")
    assert words == ["see", "https://example.org/a-b?c=d,", "<2de>", "now"]
    with pytest.raises(ValueError, match=r"--protect '\(': not a regular expression"):
        TextConfig("en", "de", protect=("(",))


def test_settings_saved_before_tags_were_protected_keep_splitting_them():
    saved = {"source_lang": "en", "target_lang": "de", "tokenizer": "moses", "normalize_punctuation": True,
             "lowercase": False, "aggressive_dash_splits": False}
    assert not TextConfig.from_dict(saved).protect_tags
    assert TextConfig.from_dict(TextConfig("en", "de").to_dict()) == TextConfig("en", "de")
