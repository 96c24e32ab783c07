"""SentencePiece as the second subword backend: the model, preprocess, train and translate."""

import io
import json
import unicodedata

import numpy as np
import pytest
import sentencepiece
from click.testing import CliRunner
from conftest import head, write_lines

from nmt_cli import NmtError
from nmt_cli.cli import main
from nmt_cli.config import TextConfig
from nmt_cli.data import IndexedArray
from nmt_cli.pieces import learn_sentencepiece, load_sentencepiece
from nmt_cli.text import TextProcessor
from nmt_cli.vocab import Vocabulary


def run(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


@pytest.fixture
def corpus(multi30k, tmp_path_factory):
    raw = tmp_path_factory.mktemp("raw")
    for split, n in (("train", 2000), ("val", 100)):
        for lang in ("en", "de"):
            write_lines(raw / f"{split}.{lang}", head(multi30k / f"{split}.{lang}", n))
    return raw


def test_model_has_our_special_ids_and_round_trips_lines(corpus):
    lines = head(corpus / "train.en", 2000) + head(corpus / "train.de", 2000)
    model = load_sentencepiece(learn_sentencepiece(lines, 600, "unigram", threads=2))
    assert [model.id_to_piece(i) for i in range(4)] == ["<pad>", "<s>", "</s>", "<unk>"]
    exact = sum(model.decode(model.encode(line, out_type=str)) == line for line in lines)
    assert exact >= 0.99 * len(lines)


def test_a_model_with_other_special_ids_is_refused(corpus):
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(head(corpus / "train.en", 500)),
                                             model_writer=model, vocab_size=200, minloglevel=2)
    with pytest.raises(NmtError, match=r"other.model: its special pieces .* have ids \[0, 1, 2, 0\], not 0-3"):
        load_sentencepiece(model.getvalue(), "other.model")
    with pytest.raises(NmtError, match="garbage.model: not a SentencePiece model"):
        load_sentencepiece(b"not a model", "garbage.model")


def test_preprocess_train_and_translate_with_sentencepiece(corpus, tmp_path):
    result = run("preprocess", "-s", "en", "-t", "de", "--trainpref", corpus / "train", "--validpref", corpus / "val",
                 "--destdir", tmp_path / "data", "--subword", "sentencepiece", "--vocab-size", 600, "--quiet",
                 "--workers", 2)
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "data/meta.json").read_text())
    assert meta["sentencepiece"] == "spm.model" and "spm.model" in meta["checksums"] and meta["bpe_codes"] is None
    text = TextConfig.from_dict(meta["text"])
    processor = TextProcessor(text, "de", sentencepiece=(tmp_path / "data/spm.model").read_bytes())
    vocab = Vocabulary.load(tmp_path / "data/dict.de.txt")
    ids = IndexedArray(tmp_path / "data/valid.de", np.dtype(meta["dtype"]))
    expected = [unicodedata.normalize("NFKC", line) for line in head(corpus / "val.de", 100)]  # SentencePiece's
    assert [processor.decode(vocab.decode(ids[i].tolist())) for i in range(len(ids))] == expected

    result = run("train", tmp_path / "data", "--save-dir", tmp_path / "ck", "--arch", "small", "--d-model", 32,
                 "--d-ff", 64, "--heads", 2, "--encoder-layers", 1, "--decoder-layers", 1, "--max-updates", 3,
                 "--max-tokens", 1000, "--device", "cpu", "--threads", 1, "--quiet")
    assert result.exit_code == 0, result.output
    result = run("translate", "-m", tmp_path / "ck/checkpoint_last.pt", "--max-len-b", 3, "--device", "cpu",
                 input="A dog.\n\nTwo men.\n")
    assert result.exit_code == 0 and len(result.output.splitlines()) == 3, result.output

    # new test sets with the same model and vocabularies
    result = run("preprocess", "-s", "en", "-t", "de", "--testpref", corpus / "val", "--destdir", tmp_path / "more",
                 "--from-data", tmp_path / "data", "--quiet")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "more/test.de.bin").read_bytes() == (tmp_path / "data/valid.de.bin").read_bytes()


@pytest.mark.parametrize("flags, message", [
    (["--subword", "sentencepiece"], "--subword sentencepiece needs --vocab-size N"),
    (["--sentencepiece-model", "SELF"], "--sentencepiece-model needs --subword sentencepiece"),
])
def test_missing_or_misplaced_sentencepiece_options_are_refused(corpus, tmp_path, flags, message):
    flags = [str(corpus / "train.en") if flag == "SELF" else flag for flag in flags]
    result = run("preprocess", "-s", "en", "-t", "de", "--trainpref", corpus / "train", "--destdir", tmp_path / "d",
                 "--quiet", *flags)
    assert result.exit_code == 1 and message in result.output and not (tmp_path / "d").exists()
