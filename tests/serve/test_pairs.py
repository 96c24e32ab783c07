"""The language pairs of a server (pairs.py): `-m [SRC-TGT=]CHECKPOINT` values, the pair a request
names, LibreTranslate's list."""

import pytest
from conftest import tiny_checkpoint

from nmt_cli.serve.pairs import NoSuchPair, choose, languages, load_pairs

PAIRS = [("en", "de"), ("de", "en"), ("en", "fr")]


def test_a_request_names_its_pair_or_leaves_out_what_one_pair_fits():
    assert choose(PAIRS, "de", "en") == ("de", "en") and choose(PAIRS, None, "fr") == ("en", "fr")
    assert choose(PAIRS, "auto", "fr") == ("en", "fr") and choose([("en", "de")], None, None) == ("en", "de")
    with pytest.raises(NoSuchPair, match=r"^no model for fr-de \(this server translates en-de, de-en, en-fr\)$"):
        choose(PAIRS, "fr", "de")
    with pytest.raises(NoSuchPair, match=r"^en-any fits 2 language pairs \(en-de, de-en, en-fr\): name the source "
                                         "and the target$"):
        choose(PAIRS, "en", None)


def test_languages_as_libretranslate_lists_them():
    assert languages(PAIRS) == [{"code": "en", "name": "en", "targets": ["de", "fr"]},
                                {"code": "de", "name": "de", "targets": ["en"]}]


def test_model_values_with_and_without_a_pair(tmp_path, monkeypatch):
    first, second = tiny_checkpoint(tmp_path / "a.pt", seed=1), tiny_checkpoint(tmp_path / "b.pt", seed=2)
    odd = tmp_path / "x-y=z.pt"  # a file whose name reads as a pair: a file
    odd.write_bytes(first.read_bytes())
    pairs = load_pairs([str(first), f"en-de={second}", f"en-de={first}", str(odd)])
    assert list(pairs) == [("src", "tgt"), ("en", "de")]  # the checkpoint's own languages without a pair
    assert len(pairs[("src", "tgt")]) == 2 and len(pairs[("en", "de")]) == 2  # ensembles
