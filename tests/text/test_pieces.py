"""SentencePiece as the second subword backend: the model, preprocess, train and translate."""

import io
import json
import unicodedata

import numpy as np
import pytest
import sentencepiece
from click.testing import CliRunner
from conftest import head, write_lines

from nmt_cli.cli import main
from nmt_cli.config import TextConfig
from nmt_cli.corpus.data import IndexedArray
from nmt_cli.errors import NmtError
from nmt_cli.text.pieces import learn_sentencepiece, load_sentencepiece
from nmt_cli.text.processor import TextProcessor
from nmt_cli.text.vocab import Vocabulary


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
    model = load_sentencepiece(learn_sentencepiece(lines, 600, "unigram"))
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


@pytest.mark.parametrize("flags, code, message", [
    (["--subword", "sentencepiece"], 1, "--subword sentencepiece needs --vocab-size N"),
    (["--sentencepiece-model", "SELF"], 2, "--sentencepiece-model applies only with --subword sentencepiece"),
    (["--sentencepiece-samples", "2"], 2, "--sentencepiece-samples applies only with --subword sentencepiece"),
    (["--subword", "sentencepiece", "--vocab-size", "100", "--bpe-codes", "SELF"], 2,
     "--bpe-codes applies only to --subword bpe"),
    (["--subword", "sentencepiece", "--vocab-size", "5"], 1, "--vocab-size 5 is too small for "),
    (["--subword", "sentencepiece", "--vocab-size", "100", "--protect", "x+"], 2,
     "--protect applies only to --subword bpe (SentencePiece reads the raw text)"),
])
def test_missing_or_misplaced_sentencepiece_options_are_refused(corpus, tmp_path, flags, code, message):
    flags = [str(corpus / "train.en") if flag == "SELF" else flag for flag in flags]
    result = run("preprocess", "-s", "en", "-t", "de", "--trainpref", corpus / "train", "--destdir", tmp_path / "d",
                 "--quiet", *flags)
    assert result.exit_code == code and message in result.output and not (tmp_path / "d").exists()
    assert "character_coverage" not in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("damage, message", [
    ("latin-1", "bad.de:2: invalid UTF-8 (byte 1: invalid continuation byte)"),
    ("empty", "no sentence to learn a SentencePiece model from"),
])
def test_sentencepiece_on_bad_text_says_what_the_bpe_path_says(corpus, tmp_path, damage, message):
    for lang in ("en", "de"):
        lines = (corpus / f"train.{lang}").read_bytes().splitlines(keepends=True)
        if damage == "latin-1":
            lines[1] = "Überall\n".encode("latin-1") if lang == "de" else lines[1]
        (tmp_path / f"bad.{lang}").write_bytes(b"".join(lines) if damage == "latin-1" else b"")
    result = run("preprocess", "-s", "en", "-t", "de", "--trainpref", tmp_path / "bad", "--destdir", tmp_path / "d",
                 "--subword", "sentencepiece", "--vocab-size", "100", "--quiet")
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert message in result.output and "lines.py" not in result.output and not (tmp_path / "d").exists()


def sampled_data(corpus, dest, workers, model=("--vocab-size", 600)):
    result = run("preprocess", "-s", "en", "-t", "de", "--trainpref", corpus / "train", "--validpref", corpus / "val",
                 "--destdir", dest, "--subword", "sentencepiece", *model, "--sentencepiece-samples", 2,
                 "--quiet", "--workers", workers)
    assert result.exit_code == 0, result.output
    return dest


@pytest.mark.slow
def test_sampled_segmentations_are_the_same_text_cut_otherwise(corpus, tmp_path):
    data = sampled_data(corpus, tmp_path / "data", workers=2)
    meta = json.loads((data / "meta.json").read_text())
    processor = TextProcessor(TextConfig.from_dict(meta["text"]), "en", sentencepiece=(data / "spm.model").read_bytes())
    vocab = Vocabulary.load(data / "dict.en.txt")
    splits = [IndexedArray(data / f"{name}.en", np.dtype(meta["dtype"])) for name in ("train", "train.sample0",
                                                                                       "train.sample1")]
    assert len({len(split) for split in splits}) == 1
    texts = [[processor.decode(vocab.decode(split[i].tolist())) for i in range(len(split))] for split in splits]
    assert texts[0] == texts[1] == texts[2]
    assert len({(data / f"{name}.en.bin").read_bytes() for name in ("train", "train.sample0", "train.sample1")}) == 3
    # Any number of workers learns the same model (its trainer's threads are fixed) and, seeded per
    # chunk, samples the same segmentations.
    again = sampled_data(corpus, tmp_path / "again", 1)
    for name in ("spm.model", "dict.en.txt", "train.sample1.de.bin", "train.en.bin"):
        assert (again / name).read_bytes() == (data / name).read_bytes(), name


@pytest.mark.slow
def test_training_takes_a_sampled_segmentation_per_epoch_and_resumes_exactly(corpus, tmp_path):
    import torch

    from nmt_cli.config import TrainConfig
    from nmt_cli.model import checkpoint as ckpt
    from nmt_cli.model.architecture import PRESETS
    from nmt_cli.train.run import TrainingRun

    data = sampled_data(corpus, tmp_path / "data", workers=2)
    model = PRESETS["small"].replace(encoder_layers=1, decoder_layers=1, d_model=32, d_ff=64, heads=2)

    def train(save_dir, **limits):
        config = TrainConfig(max_tokens=3000, device="cpu", threads=1, save_interval_minutes=1000.0, **limits)
        run = TrainingRun(data, save_dir, model, config, progress_bar=False)
        run.run()
        return run

    straight = train(tmp_path / "straight", max_epochs=3)
    samples = straight.plan.samples
    assert len(samples) == 2 and straight.plan.split(3) == straight.plan.split(1) != straight.plan.split(2)
    assert straight.prefetcher.data is samples[0][0]  # epoch 3 of 2 samples: the first again
    resumed = train(tmp_path / "resumed", max_updates=len(samples[0][1]) + 3)  # stop inside epoch 2
    assert resumed.prefetcher.data is resumed.plan.samples[1][0]
    train(tmp_path / "resumed", max_epochs=3)
    a = ckpt.load(tmp_path / "straight/checkpoint_last.pt")["model"]
    b = ckpt.load(tmp_path / "resumed/checkpoint_last.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_without_training_data_a_model_and_vocabulary_must_be_given(corpus, tmp_path):
    result = run("preprocess", "-s", "en", "-t", "de", "--testpref", corpus / "val", "--destdir", tmp_path / "d",
                 "--subword", "sentencepiece", "--srcdict", corpus / "val.en", "--quiet")
    assert result.exit_code == 1 and "give --srcdict (and --sentencepiece-model)" in result.output
    result = run("preprocess", "-s", "en", "-t", "de", "--testpref", corpus / "val", "--destdir", tmp_path / "d",
                 "--subword", "sentencepiece", "--sentencepiece-samples", 2, "--sentencepiece-model", corpus / "val.en",
                 "--srcdict", corpus / "val.en", "--quiet")
    assert result.exit_code == 1 and "--sentencepiece-samples samples the training split" in result.output
