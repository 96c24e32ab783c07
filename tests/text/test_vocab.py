"""Vocabulary: fixed specials, stable ids, file round trip, bad files."""

import random
from collections import Counter

import pytest

from nmt_cli.text.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Vocabulary, VocabularyError


def test_specials_have_fixed_ids():
    vocab = Vocabulary.build(Counter("a b c".split()))
    assert vocab.tokens[:4] == ["<pad>", "<s>", "</s>", "<unk>"]
    assert (PAD_ID, BOS_ID, EOS_ID, UNK_ID) == (0, 1, 2, 3)
    assert vocab.encode(["zzz"]) == [UNK_ID]


def test_ids_are_stable_whatever_the_counting_order():
    words = "the cat sat on the mat and the dog sat too".split()
    shuffled = words[:]
    random.Random(1).shuffle(shuffled)
    a, b = Vocabulary.build(Counter(words)), Vocabulary.build(Counter(shuffled))
    assert a.tokens == b.tokens
    assert a.tokens[4:7] == ["the", "sat", "and"]  # by count, then alphabetically


def test_min_count_and_size_limit():
    counts = Counter({"a": 5, "b": 3, "c": 1, "d": 1})
    assert Vocabulary.build(counts, min_count=2).tokens[4:] == ["a", "b"]
    assert len(Vocabulary.build(counts, max_size=6)) == 6


def test_padding_factor_appends_unused_entries_to_a_multiple():
    counts = Counter({"a": 5, "madeupword0000": 2, "b": 1})
    vocab = Vocabulary.build(counts, padding_factor=8)
    assert len(vocab) == 8
    assert vocab.tokens[4:] == ["a", "madeupword0000", "b", "madeupword0001"]  # a real token is kept
    assert vocab.counts[-1] == 0
    assert len(Vocabulary.build(Counter({"a": 1, "b": 1, "c": 1, "d": 1}), padding_factor=8)) == 8  # none needed
    assert len(Vocabulary.build(Counter({"a": 1, "b": 1, "c": 1}), padding_factor=1)) == 7


def test_file_round_trip(tmp_path):
    vocab = Vocabulary.build(Counter("x y y z z z".split()))
    vocab.save(tmp_path / "dict.txt")
    loaded = Vocabulary.load(tmp_path / "dict.txt")
    assert loaded == vocab and loaded.counts == vocab.counts


@pytest.mark.parametrize(
    "text,message",
    [("a 1\nb 2\na 3\n", r"dict.txt:3: duplicate token 'a' \(also on line 1\)"),
     ("a 1\nb\n", "dict.txt:2: expected 'token count'"),
     ("<unk> 4\nx 1\n<unk> 2\n", r"dict.txt:3: duplicate token '<unk>' \(also on line 1\)")],
)
def test_bad_vocabulary_files_name_file_and_line(tmp_path, text, message):
    (tmp_path / "dict.txt").write_text(text)
    with pytest.raises(VocabularyError, match=message):
        Vocabulary.load(tmp_path / "dict.txt")


def test_a_specials_name_may_be_an_ordinary_token_too(tmp_path):
    """A released model's vocabulary may hold `<s>` as an ordinary entry (OPUS-MT tc-big): it keeps
    its own id and name; text that reads `<s>` is our special."""
    vocab = Vocabulary(["a", "<s>", "b"])
    assert vocab.tokens[4:] == ["a", "<s>", "b"] and vocab.decode([5]) == ["<s>"]
    assert vocab.encode(["<s>", "b"]) == [BOS_ID, 6]
    vocab.save(tmp_path / "dict.txt")
    assert Vocabulary.load(tmp_path / "dict.txt") == vocab


def test_fillers_are_known_and_never_read_from_text():
    vocab = Vocabulary.build(Counter({"a": 2, "madeupword0001": 5}), padding_factor=8)
    assert vocab.tokens[4:] == ["madeupword0001", "a", "madeupword0000", "madeupword0002"]
    assert vocab.fillers == [6, 7]  # a word of the corpus that looks like one is a word
    assert vocab.encode(["madeupword0000", "madeupword0001", "a"]) == [UNK_ID, 4, 5]
    assert Vocabulary(vocab.tokens[4:]).fillers == [6, 7]  # as read back from a checkpoint
    assert Vocabulary.build(Counter({"a": 1}), padding_factor=1).fillers == []
