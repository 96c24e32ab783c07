"""tokenizer.json (interop/tokenizer_json.py): Hugging Face's tokenizers in Python and transformers.js
in Node encode text into the ids `nmt translate` gives it, on Multi30k and on text that
SentencePiece normalizes, for a model trained here and for imported OPUS-MT releases (a
multilingual one's >>code<< too); models whose text no tokenizer.json can carry are refused in
one line."""

import dataclasses
import json

import pytest
from conftest import (
    cli,
    multi30k_lines,
    opus_mt_release,
    run_transformers_js,
    tiny_checkpoint,
    tiny_sentencepiece_checkpoint,
)

from nmt_cli.decode.pipeline import TextPipeline
from nmt_cli.interop.tokenizer_json import javascript_refusal, tokenizer_config, tokenizer_json
from nmt_cli.model.checkpoint import ModelBundle, load_bundle
from nmt_cli.text.pieces import learn_sentencepiece
from nmt_cli.text.vocab import EOS_ID, UNK_ID, Vocabulary

pytest.importorskip("google.protobuf")  # SentencePiece's model is read with protobuf (the export extra's onnx has it)

ODD = ["  two  spaces\tand a tab ", "ﬁne Ｆｕｌｌ ｗｉｄｔｈ ① ²", "naïve café — “quotes” «guillemets»",
       "Straße ÄÖÜ äöü", "漢字 and 🙂", "A.B.C. 3,5 km/h (etwa) - ja!", "Zwischenzeitlich regnet es.", "x"]


@pytest.fixture(scope="module")
def lines() -> list[str]:
    """Multi30k's validation lines in both languages, and odd ones (read in a test, not at import:
    without Multi30k its tests skip, saying why, and collection has no error)."""
    return multi30k_lines(500, "en", "val") + multi30k_lines(500, "de", "val") + ODD


def vocabulary(pieces: list[str]) -> list[str]:
    """The model's tokens: the pieces less every 40th (SentencePiece outputs them; the vocabulary
    reads them as <unk>), and one token SentencePiece never outputs."""
    return [piece for i, piece in enumerate(pieces) if i % 40 != 7] + ["\u2581Zwischenzeitlich"]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> ModelBundle:
    """An untrained tiny model over a SentencePiece model of Multi30k's English and German."""
    path = tmp_path_factory.mktemp("tok") / "m.pt"
    lines = multi30k_lines(3000, "en") + multi30k_lines(3000, "de")
    return load_bundle(tiny_sentencepiece_checkpoint(path, lines=lines, vocab_size=1000, vocabulary=vocabulary,
                                                    max_positions=256))


def nmt_ids(bundle: ModelBundle, lines: list[str]) -> list[list[int]]:
    pipeline = TextPipeline(bundle, bundle.model.config.max_positions)
    end = [EOS_ID] if bundle.model.config.source_eos else []
    return [pipeline.source_ids(line, n) + end for n, line in enumerate(lines, 1)]


def as_nmt_reads(ids: list[int], bundle: ModelBundle) -> list[int]:
    """A piece past the vocabulary reads <unk>, as the exported encoder reads it."""
    return [i if i < len(bundle.src_vocab) else UNK_ID for i in ids]


def test_tokenizers_encodes_as_nmt_does(bundle, lines):
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer.from_str(json.dumps(tokenizer_json(bundle)))
    found = [as_nmt_reads(tokenizer.encode(line).ids, bundle) for line in lines]
    expected = nmt_ids(bundle, lines)
    assert any(UNK_ID in ids for ids in expected[:1000])  # pieces the vocabulary lacks were read
    assert found == expected
    assert tokenizer.decode(expected[0]) == lines[0]


def transformers_js_ids(bundle: ModelBundle, lines: list[str], module, folder) -> list[list[int]]:
    """transformers.js's ids of `lines` from the model's tokenizer files (written into `folder`), as nmt reads them."""
    folder.mkdir()
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json(bundle)))
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(bundle)))
    ids = run_transformers_js(module, folder, lines, translate=False)["ids"]
    return [as_nmt_reads(row, bundle) for row in ids]


def test_transformers_js_encodes_as_nmt_does(bundle, lines, transformers_js, tmp_path):
    assert transformers_js_ids(bundle, lines, transformers_js, tmp_path / "tokenizer") == nmt_ids(bundle, lines)


@pytest.fixture(scope="module", params=[(), (">>fra<<", ">>por<<")], ids=["bilingual", "multilingual"])
def release(request, tmp_path_factory) -> ModelBundle:
    """An imported OPUS-MT release (en-mg's SentencePiece models and vocabulary, random weights), with
    target-language codes or without."""
    tmp = tmp_path_factory.mktemp("release")
    opus_mt_release(tmp / "release", codes=request.param)
    assert cli("import", tmp / "release", "-o", tmp / "m.pt").exit_code == 0
    return load_bundle(tmp / "m.pt")


def test_an_imported_release_encodes_as_nmt_does(release, transformers_js, tmp_path):
    lines = multi30k_lines(200, "en", "val") + ODD
    codes = release.language_codes
    if codes:  # a multilingual model's lines begin with their target language
        lines = [f"{codes[n % len(codes)]} {line}" for n, line in enumerate(lines)]
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer.from_str(json.dumps(tokenizer_json(release)))
    expected = nmt_ids(release, lines)
    assert [as_nmt_reads(tokenizer.encode(line).ids, release) for line in lines] == expected
    assert transformers_js_ids(release, lines, transformers_js, tmp_path / "tokenizer") == expected


def test_sources_without_eos_end_without_it(bundle):
    config = bundle.model.config.replace(source_eos=False)
    model = type(bundle.model)(config, len(bundle.src_vocab), len(bundle.tgt_vocab), 0, True)
    post = tokenizer_json(dataclasses.replace(bundle, model=model))
    assert post["post_processor"]["single"] == [{"Sequence": {"id": "A", "type_id": 0}}]


def test_what_no_tokenizer_json_can_carry_is_refused_in_one_line(bundle, tmp_path):
    words = load_bundle(tiny_checkpoint(tmp_path / "w.pt"))
    separate = dataclasses.replace(bundle, tgt_vocab=Vocabulary(list(reversed(bundle.tgt_vocab.tokens[4:]))))
    bpe = dataclasses.replace(bundle, sentencepiece=learn_sentencepiece(multi30k_lines(500), 300, "bpe"))
    reasons = {"whitespace tokens": words, "--separate-dictionaries": separate, "--sentencepiece-type unigram": bpe}
    for words, refused in reasons.items():
        refusal = javascript_refusal(refused)
        assert refusal is not None and words in refusal and "\n" not in refusal
    assert javascript_refusal(bundle) is None

