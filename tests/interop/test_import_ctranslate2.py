"""`nmt import` of a CTranslate2 model directory: what `nmt export --format ctranslate2` wrote comes
back bit for bit in float32, and as CTranslate2 computes with it in int8 (q / scale, the scale
computed here by CTranslate2's own rule), for every architecture nmt-cli trains; what CTranslate2's
converters made of an OPUS-MT release (`ct2-transformers-converter`) translates greedily as
transformers' generate(), and of fairseq's checkpoints (`ct2-fairseq-converter`, the fixtures of
tests/fixtures/ctranslate2/make.sh) as fairseq does; what ours cannot hold is refused in one line
naming it. (Marian's converter: tests/interop/test_import_marian.py.)"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import NEEDS_CTRANSLATE2, multi30k_lines, opus_mt_release, tiny_checkpoint

from nmt_cli.cli import main
from nmt_cli.decode.translator import Translator
from nmt_cli.errors import NmtError
from nmt_cli.interop.importer import import_model
from nmt_cli.model import checkpoint as ckpt
from nmt_cli.run_config import ImportConfig

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
VARIANTS = [{}, {"norm": "pre", "positions": "learned", "tied_output": False, "output_bias": True},
            {"activation": "gelu", "scale_embeddings": False, "source_eos": False},
            {"decoder_start": "eos", "norm_eps": 1e-6}, {"embedding_norm": True, "norm": "pre"}]


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def exported(tmp_path, quantization, shared=True, **variant):
    from nmt_cli.interop.export_ctranslate2 import save_ctranslate2

    model = tiny_checkpoint(tmp_path / "m.pt", seed=4, max_positions=40, **variant)
    bundle = ckpt.load_bundle(model)
    if not shared:  # the same tokens, two matrices
        original = ckpt.load(model)
        original["model"]["src_embed.tokens.weight"] = original["model"]["tgt_embed.tokens.weight"] * 0.5
        original["shared_vocab"] = False
        ckpt.save(original, model)
        bundle = ckpt.load_bundle(model)
    save_ctranslate2(bundle, tmp_path / "ct2", quantization)
    return model


def int8(w: torch.Tensor) -> torch.Tensor:
    """CTranslate2's int8 weights (a scale per row: 127 over its largest magnitude), as it computes."""
    w = w.numpy().astype(np.float32)
    scale = np.float32(127.0) / np.maximum(np.abs(w).max(axis=1), np.float32(127) / np.finfo(np.float32).max)
    return torch.from_numpy(np.rint(w * scale[:, None]).astype(np.int8).astype(np.float32) / scale[:, None])


@NEEDS_CTRANSLATE2
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shared", [True, False])
def test_a_float32_export_comes_back_bit_for_bit(tmp_path, variant, shared):
    model = exported(tmp_path, "float32", shared, **variant)
    back = import_model(tmp_path / "ct2", tmp_path / "back.pt")
    original = ckpt.load(model)
    assert back["model_config"] == original["model_config"] and back["shared_vocab"] == shared
    assert back["src_vocab"] == original["src_vocab"] and back["text_config"] == original["text_config"]
    assert set(back["model"]) == set(original["model"])
    for name, tensor in original["model"].items():
        assert torch.equal(back["model"][name], tensor), name


@NEEDS_CTRANSLATE2
def test_an_int8_export_comes_back_as_ctranslate2_computes_with_it(tmp_path):
    model = exported(tmp_path, "int8", **VARIANTS[1])
    notes = []
    back = import_model(tmp_path / "ct2", tmp_path / "back.pt", warn=notes.append)["model"]
    original = ckpt.load(model)["model"]
    assert any("kept as learned positions" in note for note in notes)  # its positions were learned
    for name, tensor in original.items():
        quantized = name.endswith("weight") and tensor.dim() == 2 and "learned" not in name and "norm" not in name
        assert torch.equal(back[name], int8(tensor) if quantized else tensor), name


@NEEDS_CTRANSLATE2
def test_the_imported_model_translates_as_the_exported_one(tmp_path):
    model = exported(tmp_path, "float32")
    assert run("import", tmp_path / "ct2", "-o", tmp_path / "back.pt").exit_code == 0
    lines = ["a b c", "d e f g h", "p"]
    outputs = [Translator.load(path, device="cpu").translate(lines) for path in (model, tmp_path / "back.pt")]
    assert outputs[0] == outputs[1]


@NEEDS_CTRANSLATE2
def test_without_nmt_cli_json_the_search_is_ctranslate2s_and_the_text_is_given(tmp_path):
    exported(tmp_path, "float32")
    (tmp_path / "ct2" / "nmt-cli.json").unlink()
    refused = run("import", tmp_path / "ct2", "-o", tmp_path / "x.pt")
    assert refused.exit_code == 1 and "give -s SRC -t TGT" in refused.output
    refused = run("import", tmp_path / "ct2", "-o", tmp_path / "x.pt", "-s", "en", "-t", "de")
    assert refused.exit_code == 1 and "give --sentencepiece, --bpe-codes, or --tokenizer none" in refused.output
    said = run("import", tmp_path / "ct2", "-o", tmp_path / "x.pt", "-s", "en", "-t", "de", "--tokenizer", "none")
    assert said.exit_code == 0 and "note: the text pipeline: as given" in said.output
    back = import_model(tmp_path / "ct2", tmp_path / "x.pt", options=ImportConfig("en", "de", tokenizer="none"))
    assert back["released"]["search"]["beam"] == 2 and back["released"]["search"]["stopping"] == "early"
    assert back["text_config"]["source_lang"] == "en"


@NEEDS_CTRANSLATE2
def test_older_vocabularies_a_token_a_line_are_read_and_missing_ones_named(tmp_path):
    exported(tmp_path, "float32")
    folder = tmp_path / "ct2"
    tokens = json.loads((folder / "shared_vocabulary.json").read_text())
    (folder / "shared_vocabulary.json").unlink()
    refused = run("import", folder, "-o", tmp_path / "x.pt")
    assert refused.exit_code == 1 and "no shared_vocabulary.json, nor source_vocabulary.json" in refused.output
    (folder / "shared_vocabulary.txt").write_text("".join(token + "\n" for token in tokens))
    assert import_model(folder, tmp_path / "x.pt")["src_vocab"] == ckpt.load(tmp_path / "m.pt")["src_vocab"]


@NEEDS_CTRANSLATE2
def test_sources_that_start_with_bos_are_refused(tmp_path):
    exported(tmp_path, "float32")
    settings = json.loads((tmp_path / "ct2" / "config.json").read_text())
    (tmp_path / "ct2" / "config.json").write_text(json.dumps({**settings, "add_source_bos": True}))
    with pytest.raises(NmtError, match="add_source_bos: nmt-cli's sources do not start with <s>"):
        import_model(tmp_path / "ct2", tmp_path / "x.pt")


def rewrite(path, old: bytes, new: bytes):
    data = path.read_bytes()
    assert old in data
    path.write_bytes(data.replace(old, new))


@NEEDS_CTRANSLATE2
def test_what_ours_cannot_hold_is_refused_in_one_line(tmp_path):
    exported(tmp_path, "float32")
    bin_path = tmp_path / "ct2" / "model.bin"
    original = bin_path.read_bytes()
    rewrite(bin_path, b"\x10\x00TransformerSpec\x00", b"\x10\x00WhisperSpecXXXX\x00")
    result = run("import", tmp_path / "ct2", "-o", tmp_path / "x.pt")
    assert result.exit_code == 1
    assert "a WhisperSpecXXXX; nmt import reads CTranslate2's encoder-decoder" in result.output
    bin_path.write_bytes(original)  # a variable ours has no place for, named as CTranslate2 names it
    rewrite(bin_path, b"encoder/layer_0/ffn/linear_0/bias", b"encoder/layer_0/ffn/linear_0/bia2")
    result = run("import", tmp_path / "ct2", "-o", tmp_path / "x.pt")
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert "linear_0/bia2, which nmt-cli's Transformer has no place for" in result.output
    bin_path.write_bytes(original[:-7])
    result = run("import", tmp_path / "ct2", "-o", tmp_path / "x.pt")
    assert result.exit_code == 1 and "cut short or damaged" in result.output
    bin_path.write_bytes(original)
    (tmp_path / "ct2" / "config.json").write_text(json.dumps({"model_type": "marian"}))
    result = run("import", tmp_path / "ct2", "-o", tmp_path / "x.pt")
    assert result.exit_code == 1 and "not CTranslate2's config.json" in result.output


@NEEDS_CTRANSLATE2
def test_relative_positions_are_refused_naming_them(tmp_path):
    exported(tmp_path, "float32")
    rewrite(tmp_path / "ct2" / "model.bin", b"encoder/layer_0/ffn/linear_0/bias", b"encoder/layer_0/relative_position")
    with pytest.raises(NmtError, match="layer_0/relative_position .relative positions., which nmt-cli's Transformer"):
        import_model(tmp_path / "ct2", tmp_path / "x.pt")


@pytest.mark.slow
@NEEDS_CTRANSLATE2
def test_an_opus_mt_release_converted_by_ctranslate2_translates_as_generate(tmp_path):
    """CTranslate2's own converter (ct2-transformers-converter) of an OPUS-MT release, random small
    weights: the import's greedy translations are transformers' generate()'s."""
    import transformers
    from ctranslate2.converters import TransformersConverter

    model = opus_mt_release(tmp_path / "hf", seed=2)
    config = (tmp_path / "hf" / "config.json").read_text()
    with torch.no_grad():  # a release's decoder starts from <pad>'s row, zeros (Marian's start): as released
        model.model.shared.weight[model.config.pad_token_id] = 0
    model.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "config.json").write_text(config)
    TransformersConverter(str(tmp_path / "hf"), copy_files=["source.spm", "target.spm"]).convert(
        str(tmp_path / "ct2"))
    assert run("import", tmp_path / "ct2", "-o", tmp_path / "m.pt", "-s", "en", "-t", "mg").exit_code == 0
    lines = multi30k_lines(40, "en", "val")
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(tmp_path / "hf"))
    with torch.no_grad():
        out = model.generate(**tokenizer(lines, return_tensors="pt", padding=True), num_beams=1, max_length=24,
                             bad_words_ids=[[tokenizer.pad_token_id]])
    theirs = tokenizer.batch_decode(out, skip_special_tokens=True)
    translator = Translator.load(tmp_path / "m.pt", device="cpu")
    ours = translator.translate(lines, beam=1, max_len_a=0, max_len_b=22, at_limit="free", min_len=0)
    assert ours == theirs
    assert len(set(ours)) > 10


@pytest.mark.parametrize("variant", ["post", "pre", "lne"])
@pytest.mark.parametrize("beam", [1, 4])
def test_ctranslate2s_conversion_of_fairseq_models_translates_as_fairseq(tmp_path, variant, beam):
    """Searched as fairseq searches (the settings the import of its checkpoint takes), the
    conversion gives fairseq's own translations; its positions, fairseq's table, come as learned."""
    words = ImportConfig("en", "de", tokenizer="none")
    direct = import_model(FIXTURES / "fairseq" / variant / "checkpoint.pt", tmp_path / "direct.pt", options=words)
    converted = import_model(FIXTURES / "ctranslate2" / f"fairseq-{variant}", tmp_path / "m.pt", options=words)
    assert converted["model_config"] == direct["model_config"]
    search = {"at_limit": "scored", **direct["released"]["search"], "beam": beam}
    ours = Translator.load(tmp_path / "m.pt", device="cpu").translate(multi30k_lines(20, "en", "val"), **search)
    assert ours == (FIXTURES / "fairseq" / variant / f"valid.beam{beam}.de").read_text().splitlines()
