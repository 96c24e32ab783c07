"""`nmt import` of OpenNMT-py 3.x checkpoints: two small real ones made by OpenNMT-py 3.5.1 itself
(tests/fixtures/onmt/make.sh: its pre-norm Transformer, sources without </s>, no attention or FFN
biases, layer norms' epsilon 1e-6; words with all embeddings shared, or SentencePiece with
separate vocabularies and the weights saved as safetensors), read without running pickled code,
and onmt_translate's own translations (beam 1 and 4) and scores of the references as the oracle."""

import argparse
import json
import os
import shutil
from pathlib import Path

import pytest
import safetensors.torch
import torch
from conftest import NEEDS_CTRANSLATE2, cli, multi30k_lines, val_reference_records, val_translations

from nmt_cli.errors import NmtError
from nmt_cli.interop.importer import import_model
from nmt_cli.interop.reading import safetensors_file
from nmt_cli.model import checkpoint as ckpt
from nmt_cli.run_config import ImportConfig

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "onmt"
FIXTURE = FIXTURES / "shared"
EN_DE = ImportConfig(source_lang="en", target_lang="de")
# Each fixture's text: whitespace tokens, or SentencePiece (its weights saved as safetensors).
TEXT = {"shared": [], "spm": ["--sentencepiece", FIXTURES / "spm" / "spm.model"]}


def imported_fixture(variant: str, out: Path) -> Path:
    result = cli("import", FIXTURES / variant / "model_step_400.pt", "-o", out, "-s", "en", "-t", "de",
                 *TEXT[variant])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module", params=list(TEXT))
def imported(request, tmp_path_factory) -> tuple[str, Path]:
    return request.param, imported_fixture(request.param, tmp_path_factory.mktemp(request.param) / "m.pt")


@pytest.mark.parametrize("beam", [1, 4])
def test_translations_are_onmt_translates(imported, beam):
    """Its beam search too (the imported --stopping onmt, --lenpen-start and --at-limit cut), on
    every line; some stop at the length limit. Where such an output ends in a lone word-boundary
    piece, onmt_translate leaves a space at its end, which nmt-cli does not write (as MarianTokenizer
    and fairseq do not)."""
    variant, model = imported
    theirs = (FIXTURES / variant / f"valid.beam{beam}.de").read_text().splitlines()
    assert val_translations(model, beam) == [line.removesuffix(" ") for line in theirs]


def test_scores_of_references_are_onmt_translates(imported):
    variant, imported = imported
    theirs = [float(x) for x in (FIXTURES / variant / "valid.reference-score").read_text().split()]  # GOLD SCORE
    records = val_reference_records(imported)
    assert [record["log_prob"] for record in records] == pytest.approx(theirs, abs=1e-4)
    # onmt_translate's "avg" penalty: over the length counting <s> and </s> (its PRED SCOREs)
    assert [r["score"] for r in records] == pytest.approx([r["log_prob"] / (len(r["tokens"]) + 1) for r in records])


@NEEDS_CTRANSLATE2
def test_the_ctranslate2_export_scores_the_references_as_onmt_translate(tmp_path):
    """The export carries what the import holds (sources without </s>, the epsilon, the biases)."""
    import ctranslate2

    imported = imported_fixture("shared", tmp_path / "m.pt")
    assert cli("export", "-m", imported, "--format", "ctranslate2", "-o", tmp_path / "ct2").exit_code == 0
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    scored = translator.score_batch([line.split() for line in multi30k_lines(20, "en", "val")],
                                    [line.split() for line in multi30k_lines(20, "de", "val")])
    theirs = [float(x) for x in (FIXTURE / "valid.reference-score").read_text().split()]
    assert [sum(result.log_probs) for result in scored] == pytest.approx(theirs, abs=1e-4)
    note = json.loads((tmp_path / "ct2" / "nmt-cli.json").read_text())["search"]["note"]
    assert "counting <s> too" in note


def changed(path: Path, vocab: dict | None = None, **options) -> Path:
    """The fixture with `options` and entries of its `vocab` changed, saved to `path`."""
    with torch.serialization.safe_globals([argparse.Namespace]):
        state = torch.load(FIXTURE / "model_step_400.pt", weights_only=True)
    for name, value in options.items():
        setattr(state["opt"], name, value)
    state["vocab"].update(vocab or {})
    torch.save(state, path)
    return path


@pytest.mark.parametrize("options, message", [
    ({"max_relative_positions": 20}, "-max_relative_positions 20: nmt-cli's model holds only 0 there"),
    ({"layer_norm": "rms"}, "-layer_norm 'rms': nmt-cli's model holds only 'standard' there"),
    ({"pos_ffn_activation_fn": "silu"}, "-pos_ffn_activation_fn 'silu' \\(nmt-cli has relu, gelu\\)"),
    ({"model_task": "lm"}, "-model_task 'lm': nmt-cli's model holds only 'seq2seq' there"),
    ({"vocab": {"decoder_start_token": "</s>"}}, "its decoder starts from '</s>': nmt-cli's starts from <s>"),
    ({"vocab": {"src": ["<unk>", "<blank>", "<s>", "</s>", "a"]}},
     "its src vocabulary: 5 tokens, where the checkpoint's embedding has 2,176 rows: not this checkpoint's"),
    ({"dropout": []}, "-dropout \\[\\]: expected a number or a list of numbers"),
    ({"attention_dropout": ["x"]}, "-attention_dropout \\['x'\\]: expected a number or a list of numbers"),
])
def test_what_cannot_be_held_is_refused_in_one_line(tmp_path, options, message):
    with pytest.raises(NmtError, match=f"^{tmp_path / 'changed.pt'}: {message}"):
        import_model(changed(tmp_path / "changed.pt", **options), tmp_path / "out.pt", options=EN_DE)
    assert not (tmp_path / "out.pt").exists()


def test_the_languages_are_asked_for(tmp_path):
    with pytest.raises(NmtError, match="model_step_400.pt: an OpenNMT-py checkpoint names no languages: give -s SRC"):
        import_model(FIXTURE / "model_step_400.pt", tmp_path / "out.pt")


def test_weights_beside_the_checkpoint_and_the_subword_model_its_options_name(tmp_path):
    """onmt_train's NAME.safetensors, or shards NAME.*.safetensors (what onmt_translate reads); the
    options' SentencePiece model by its name beside the checkpoint (where the options point, never:
    the next test); no weights anywhere: one line."""
    with torch.serialization.safe_globals([argparse.Namespace]):
        state = torch.load(FIXTURES / "spm" / "model_step_400.pt", weights_only=True)
    state["opt"].src_subword_model = state["opt"].tgt_subword_model = "/where/it/was/trained/spm.model"
    torch.save(state, tmp_path / "model_step_400.pt")
    shutil.copy(FIXTURES / "spm" / "spm.model", tmp_path / "spm.model")
    with pytest.raises(NmtError, match="model_step_400.pt: no weights in it, and no model_step_400.safetensors "
                                       "beside it"):
        import_model(tmp_path / "model_step_400.pt", tmp_path / "out.pt", options=EN_DE)
    assert not (tmp_path / "out.pt").exists()
    shutil.copy(FIXTURES / "spm" / "model_step_400.safetensors", tmp_path / "model_step_400.0.safetensors")
    weights = (tmp_path / "model_step_400.0.safetensors").read_bytes()
    with pytest.raises(NmtError, match="model_step_400.0.safetensors: the file .* which this import read"):
        import_model(tmp_path / "model_step_400.pt", tmp_path / "model_step_400.0.safetensors", options=EN_DE)
    assert (tmp_path / "model_step_400.0.safetensors").read_bytes() == weights
    import_model(tmp_path / "model_step_400.pt", tmp_path / "out.pt", options=EN_DE)
    assert val_translations(tmp_path / "out.pt", 4) == (FIXTURES / "spm" / "valid.beam4.de").read_text().splitlines()


def test_only_the_shards_onmt_writes_are_read(tmp_path):
    """NAME.0.safetensors on: a stale NAME.old.safetensors beside them changes nothing, a FIFO
    named like a shard is refused at once (never waited on), as is a weight in two shards or a
    gap in the numbers."""
    with torch.serialization.safe_globals([argparse.Namespace]):
        state = torch.load(FIXTURES / "spm" / "model_step_400.pt", weights_only=True)
    torch.save(state, tmp_path / "model_step_400.pt")
    shutil.copy(FIXTURES / "spm" / "spm.model", tmp_path / "spm.model")
    shutil.copy(FIXTURES / "spm" / "model_step_400.safetensors", tmp_path / "model_step_400.0.safetensors")
    weights = safetensors_file(tmp_path / "model_step_400.0.safetensors")
    stale = {name: torch.zeros_like(tensor) for name, tensor in weights.items()}
    safetensors.torch.save_file(stale, tmp_path / "model_step_400.old.safetensors")
    import_model(tmp_path / "model_step_400.pt", tmp_path / "out.pt", options=EN_DE)
    assert val_translations(tmp_path / "out.pt", 4) == (FIXTURES / "spm" / "valid.beam4.de").read_text().splitlines()
    os.mkfifo(tmp_path / "model_step_400.1.safetensors")
    with pytest.raises(NmtError, match=r"model_step_400.1.safetensors: not a regular file"):
        import_model(tmp_path / "model_step_400.pt", tmp_path / "out2.pt", options=EN_DE)
    (tmp_path / "model_step_400.1.safetensors").unlink()
    shutil.copy(tmp_path / "model_step_400.0.safetensors", tmp_path / "model_step_400.1.safetensors")
    with pytest.raises(NmtError, match=r"model_step_400.1.safetensors: \S+ again \(also in model_step_400.0"):
        import_model(tmp_path / "model_step_400.pt", tmp_path / "out2.pt", options=EN_DE)
    (tmp_path / "model_step_400.1.safetensors").rename(tmp_path / "model_step_400.2.safetensors")
    with pytest.raises(NmtError, match=r"its shards are model_step_400.0.safetensors, model_step_400.2.safetensors"):
        import_model(tmp_path / "model_step_400.pt", tmp_path / "out2.pt", options=EN_DE)
    assert not (tmp_path / "out2.pt").exists()


def test_a_file_the_options_name_elsewhere_is_never_read(tmp_path):
    """A checkpoint whose options name any file as its BPE codes (`transforms: [bpe]`) does not get
    that file's text into the import, and so into an export: only one beside it, and the import
    says which it read."""
    with torch.serialization.safe_globals([argparse.Namespace]):
        state = torch.load(FIXTURE / "model_step_400.pt", weights_only=True)
    (tmp_path / "outside").mkdir()
    secret = tmp_path / "outside" / "codes"
    secret.write_text("#version: 0.2\nse cret\n")
    state["opt"].transforms, state["opt"].src_subword_model = ["bpe"], str(secret)
    (tmp_path / "model").mkdir()
    torch.save(state, tmp_path / "model" / "model_step_400.pt")
    refused = cli("import", tmp_path / "model" / "model_step_400.pt", "-o", tmp_path / "out.pt", "-s", "en", "-t", "de")
    assert refused.exit_code == 1 and "no codes is beside it: give --bpe-codes FILE" in refused.output
    assert not (tmp_path / "out.pt").exists()
    (tmp_path / "model" / "codes").write_text("#version: 0.2\na b\n")  # one beside it, of that name
    done = cli("import", tmp_path / "model" / "model_step_400.pt", "-o", tmp_path / "out.pt", "-s", "en", "-t", "de")
    assert done.exit_code == 0 and f"its bpe model: {tmp_path / 'model' / 'codes'}" in done.output
    assert "se cret" not in ckpt.load(tmp_path / "out.pt")["bpe_codes"]


def test_text_files_that_are_not_what_they_claim_are_one_line(tmp_path):
    (tmp_path / "codes").write_bytes(b"\xff\xfe a b\n")
    with pytest.raises(NmtError, match="codes: BPE codes not UTF-8 \\(byte 0\\)$"):
        import_model(FIXTURE / "model_step_400.pt", tmp_path / "out.pt",
                     options=ImportConfig(source_lang="en", target_lang="de", bpe_codes=tmp_path / "codes"))
    spm = ImportConfig(source_lang="en", target_lang="de", sentencepiece=FIXTURES / "spm" / "spm.model",
                       tokenizer="moses")
    with pytest.raises(NmtError, match="--tokenizer moses with --sentencepiece: OpenNMT-py's SentencePiece text is "
                                       "the raw line"):
        import_model(FIXTURES / "spm" / "model_step_400.pt", tmp_path / "out.pt", options=spm)
    (tmp_path / "model.spm").write_bytes(b"not a model")
    with pytest.raises(NmtError, match="model.spm"):
        import_model(FIXTURE / "model_step_400.pt", tmp_path / "out.pt",
                     options=ImportConfig(source_lang="en", target_lang="de", sentencepiece=tmp_path / "model.spm"))
    assert not (tmp_path / "out.pt").exists()
