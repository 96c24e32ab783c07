"""The sentence splitter an Argos package carries, trained on Multi30k's English lines and run by
MiniSBD as argostranslate runs it: paragraphs of unseen test lines split back into those lines."""

import pytest
from conftest import find_multi30k

from nmt_cli.interop.sentence_splitter import paragraph, save_splitter, train_splitter, training_lines


def test_a_paragraphs_classes_mark_each_words_end_and_each_lines_end():
    text, classes = paragraph(["A dog runs.", "It is"])
    assert text == "A dog runs. It is"
    assert classes == [1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 2, 0, 0, 1, 0, 0, 2]


def test_minisbd_splits_paragraphs_of_unseen_lines_into_those_lines(tmp_path):
    pytest.importorskip("onnxscript", reason="the splitter's ONNX graph needs onnx and onnxscript (the export extra)")
    minisbd = pytest.importorskip("minisbd", reason="MiniSBD (argostranslate's splitter) is in the dev extra")
    folder, why = find_multi30k()
    if folder is None:
        pytest.skip(why)
    train = (folder / "train.en").read_text(encoding="utf-8").splitlines()[:5000]
    test = [line.strip() for line in (folder / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()[:300]]
    model, characters = train_splitter(training_lines(train), steps=200)
    save_splitter(model, characters, "en", tmp_path / "en.onnx")
    detector = minisbd.SBDetect(str(tmp_path / "en.onnx"), use_gpu=False)
    groups = [test[i:i + 3] for i in range(0, len(test), 3)]
    exact = sum(detector.sentences(" ".join(group)) == group for group in groups)
    assert exact >= 0.9 * len(groups), exact
    assert detector.sentences(test[0]) == [test[0]]
