"""`nmt import` of fairseq checkpoints: four small real ones made by fairseq 0.12.2 itself
(tests/fixtures/fairseq/make.sh: post-norm with separate dictionaries and an untied output;
pre-norm with one dictionary, all embeddings shared and GELU; Moses and BPE text with learned
positions; SentencePiece text), read without running pickled code, and fairseq's own translations
of them (fairseq-interactive's of raw text for the BPE and SentencePiece ones), and its scores of
their references, as the oracle."""

import argparse
import math
import re
import shutil
import sys
import types
import unittest.mock
from pathlib import Path

import pytest
import torch
from conftest import cli, val_reference_records, val_translations

from nmt_cli.errors import NmtError
from nmt_cli.interop.importer import import_model
from nmt_cli.run_config import ImportConfig

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "fairseq"
WORDS = ImportConfig(source_lang="en", target_lang="de", tokenizer="none")  # the fixtures' text: whitespace tokens


# How each fixture's text was made: whitespace tokens, fairseq's Moses tokenization and BPE, or
# SentencePiece.
TEXT = {"post": ["--tokenizer", "none"], "pre": ["--tokenizer", "none"], "lne": ["--tokenizer", "none"],
        "bpe": ["--bpe-codes", FIXTURES / "bpe" / "bpe.codes"],
        "spm": ["--sentencepiece", FIXTURES / "spm" / "spm.model"]}


@pytest.fixture(scope="module", params=list(TEXT))
def imported(request, tmp_path_factory) -> tuple[str, Path]:
    """A fixture checkpoint as `nmt import` writes it."""
    out = tmp_path_factory.mktemp(request.param) / "m.pt"
    result = cli("import", FIXTURES / request.param / "checkpoint.pt", "-o", out, "-s", "en", "-t", "de",
                 *TEXT[request.param])
    assert result.exit_code == 0, result.output
    return request.param, out


@pytest.mark.parametrize("beam", [1, 4])
def test_translations_are_fairseqs(imported, beam):
    variant, model = imported  # raw lines: fairseq-interactive's input
    assert val_translations(model, beam) == (FIXTURES / variant / f"valid.beam{beam}.de").read_text().splitlines()


def test_scores_of_references_are_fairseqs(imported):
    variant, model = imported
    theirs = [float(x) for x in (FIXTURES / variant / "valid.reference-score").read_text().split()]
    scores = [record["score"] / math.log(2) for record in val_reference_records(model)]  # fairseq's are in bits
    assert scores == pytest.approx(theirs, abs=1e-4)


def test_options_pickled_as_omegaconf_containers_are_read(tmp_path):
    """Options pickled as omegaconf containers (fairseq's Hydra configuration): read as stand-ins (no
    omegaconf needed, nothing run); the checkpoint is post's (make.sh)."""
    options = ImportConfig(source_lang="en", target_lang="de", tokenizer="none", data_dir=FIXTURES / "post")
    import_model(FIXTURES / "omegaconf" / "checkpoint.pt", tmp_path / "m.pt", options=options)
    assert val_translations(tmp_path / "m.pt", 1) == (FIXTURES / "post" / "valid.beam1.de").read_text().splitlines()


def options_changed(path: Path, **changes) -> None:
    """The fixture checkpoint with `changes` to its model options, saved to `path`."""
    with torch.serialization.safe_globals([argparse.Namespace]):
        state = torch.load(FIXTURES / "post" / "checkpoint.pt", weights_only=True)
    for name, value in changes.items():
        setattr(state["cfg"]["model"], name, value)
    torch.save(state, path)


def test_what_cannot_be_held_or_read_is_refused_in_one_line(tmp_path):
    class Payload:
        def __reduce__(self):
            return (print, ("ran code from the file",))

    torch.save({"model": {}, "cfg": Payload()}, tmp_path / "code.pt")
    with pytest.raises(NmtError, match="code.pt: refused: it holds print, not a fairseq or OpenNMT-py checkpoint's "
                                       "weights or options \\(nothing in it was run\\)$"):
        import_model(tmp_path / "code.pt", tmp_path / "out.pt", options=WORDS)
    module = types.ModuleType("omegaconf.nodes")  # omegaconf itself need not be installed
    module.EnumNode = type("EnumNode", (dict,), {"__module__": "omegaconf.nodes"})  # not a plain value's
    with unittest.mock.patch.dict(sys.modules, {"omegaconf": types.ModuleType("omegaconf"),
                                                "omegaconf.nodes": module}):
        torch.save({"model": {}, "cfg": module.EnumNode()}, tmp_path / "enum.pt")
    with pytest.raises(NmtError, match="enum.pt: refused: it holds omegaconf.nodes.EnumNode"):
        import_model(tmp_path / "enum.pt", tmp_path / "out.pt", options=WORDS)
    options_changed(tmp_path / "norm.pt", adaptive_input=True)
    shutil.copy(FIXTURES / "post" / "dict.en.txt", tmp_path)
    shutil.copy(FIXTURES / "post" / "dict.de.txt", tmp_path)
    with pytest.raises(NmtError, match="norm.pt: --adaptive-input True: adaptive input"):
        import_model(tmp_path / "norm.pt", tmp_path / "out.pt", options=WORDS)
    options_changed(tmp_path / "lne.pt", layernorm_embedding=True)  # the option on, its weights not there
    shutil.copy(FIXTURES / "post" / "dict.de.txt", tmp_path)
    with pytest.raises(NmtError, match="lne.pt: the weights have no tensor encoder.layernorm_embedding.weight"):
        import_model(tmp_path / "lne.pt", tmp_path / "out.pt", options=WORDS)
    options_changed(tmp_path / "lstm.pt", arch="lstm")
    with pytest.raises(NmtError, match="lstm.pt: --arch lstm: nmt-cli imports fairseq's encoder-decoder transformer"):
        import_model(tmp_path / "lstm.pt", tmp_path / "out.pt", options=WORDS)
    options_changed(tmp_path / "ffn.pt", decoder_ffn_embed_dim=64)
    with pytest.raises(NmtError, match="--encoder-ffn-embed-dim 32 and --decoder-ffn-embed-dim 64: nmt-cli's encoder"):
        import_model(tmp_path / "ffn.pt", tmp_path / "out.pt", options=WORDS)
    with pytest.raises(NmtError, match="its configuration names no languages: give -s SRC -t TGT"):
        import_model(FIXTURES / "post" / "checkpoint.pt", tmp_path / "out.pt", options=ImportConfig(tokenizer="none"))
    (tmp_path / "dict.de.txt").unlink()
    with pytest.raises(NmtError, match="no dict.SRC.txt and dict.TGT.txt beside it"):
        import_model(tmp_path / "norm.pt", tmp_path / "out.pt", options=WORDS)
    spm = ImportConfig(source_lang="en", target_lang="de", sentencepiece=FIXTURES / "spm" / "spm.model",
                       tokenizer="moses")
    with pytest.raises(NmtError, match="--tokenizer moses with --sentencepiece: fairseq's SentencePiece text is the "
                                       "raw line"):
        import_model(FIXTURES / "spm" / "checkpoint.pt", tmp_path / "out.pt", options=spm)
    (tmp_path / "bad.model").write_bytes(b"not a model")
    with pytest.raises(NmtError, match="bad.model"):
        import_model(FIXTURES / "spm" / "checkpoint.pt", tmp_path / "out.pt",
                     options=ImportConfig(source_lang="en", target_lang="de", sentencepiece=tmp_path / "bad.model"))
    assert not (tmp_path / "out.pt").exists()
    refused = cli("import", FIXTURES, "-o", tmp_path / "out.pt", "--data-dir", FIXTURES)
    assert refused.exit_code == 1
    assert "--data-dir: only a checkpoint file (fairseq's, OpenNMT-py's) takes it" in refused.output


def test_codes_and_dictionaries_that_are_not_what_they_claim_are_one_line(tmp_path):
    (tmp_path / "codes").write_text("a b\nthree merge parts\n")
    with pytest.raises(NmtError, match="codes:2: expected a merge 'a b', got 'three merge parts'"):
        import_model(FIXTURES / "bpe" / "checkpoint.pt", tmp_path / "out.pt",
                     options=ImportConfig(source_lang="en", target_lang="de", bpe_codes=tmp_path / "codes"))
    with pytest.raises(NmtError, match="dict.en.txt: every line a token and a count: a vocabulary or dictionary "
                                       "\\(fairseq's dict.txt\\?\\), not BPE merges$"):  # merges by their shape
        import_model(FIXTURES / "bpe" / "checkpoint.pt", tmp_path / "out.pt", options=ImportConfig(
            source_lang="en", target_lang="de", bpe_codes=FIXTURES / "bpe" / "dict.en.txt"))
    shutil.copy(FIXTURES / "post" / "checkpoint.pt", tmp_path)
    shutil.copy(FIXTURES / "post" / "dict.de.txt", tmp_path)
    (tmp_path / "dict.en.txt").write_bytes(b"\xff 3\n")
    with pytest.raises(NmtError, match="dict.en.txt: a fairseq dictionary not UTF-8 \\(byte 0\\)$"):
        import_model(tmp_path / "checkpoint.pt", tmp_path / "out.pt", options=WORDS)
    lines = (FIXTURES / "post" / "dict.en.txt").read_text().splitlines()
    (tmp_path / "dict.en.txt").write_text("".join(line + "\n" for line in lines[:50]))  # another model's
    with pytest.raises(NmtError, match="dict.en.txt \\(with fairseq's 4 specials\\): 54 tokens, where the "
                                       "checkpoint's embedding has 1,048 rows: not this checkpoint's vocabulary$"):
        import_model(tmp_path / "checkpoint.pt", tmp_path / "out.pt", options=WORDS)
    assert not (tmp_path / "out.pt").exists()


def test_an_output_that_is_a_file_the_import_reads_is_refused(tmp_path):
    """Found beside the checkpoint or in --data-dir, not typed: the dictionary is still not
    replaced (checked against every file read, after reading, before writing); a new file inside
    --data-dir is only an output."""
    model = tmp_path / "model"
    shutil.copytree(FIXTURES / "post", model)
    before = (model / "dict.en.txt").read_bytes()
    refused = cli("import", model / "checkpoint.pt", "-o", model / "dict.en.txt", "-s", "en", "-t", "de",
                  "--tokenizer", "none")
    assert refused.exit_code == 1 and refused.output.count("\n") == 1, refused.output
    assert f"the file {model / 'dict.en.txt'}, which this import read" in refused.output
    assert (model / "dict.en.txt").read_bytes() == before
    (tmp_path / "elsewhere").mkdir()
    shutil.copy(model / "checkpoint.pt", tmp_path / "elsewhere" / "checkpoint.pt")
    refused = cli("import", tmp_path / "elsewhere" / "checkpoint.pt", "-o", model / "dict.de.txt", "-s", "en", "-t",
                  "de", "--tokenizer", "none", "--data-dir", model)
    assert refused.exit_code == 1 and "which this import read" in refused.output
    done = cli("import", tmp_path / "elsewhere" / "checkpoint.pt", "-o", model / "new.pt", "-s", "en", "-t", "de",
               "--tokenizer", "none", "--data-dir", model)
    assert done.exit_code == 0, done.output


def test_a_small_file_cannot_ask_for_unbounded_memory(tmp_path):
    """A list shared 40 levels deep (2^40 lists if copied reference by reference) is made once per
    object, in a plain list or through omegaconf's stand-ins; a weight that repeats one element
    2^31 times (stride 0) is refused before any copy, in one line."""
    from nmt_cli.interop.reading import load_pickled

    with torch.serialization.safe_globals([argparse.Namespace]):
        state = torch.load(FIXTURES / "post" / "checkpoint.pt", weights_only=True)
    shared: list = []
    for _ in range(40):
        shared = [shared, shared]

    class ListConfig:  # pickled as omegaconf's (omegaconf itself need not be installed)
        def __reduce__(self):
            return ListConfig, (), {"_content": shared}

    ListConfig.__module__, ListConfig.__qualname__ = "omegaconf.listconfig", "ListConfig"
    module = types.ModuleType("omegaconf.listconfig")
    module.ListConfig = ListConfig
    with unittest.mock.patch.dict(sys.modules, {"omegaconf": types.ModuleType("omegaconf"),
                                                "omegaconf.listconfig": module}):
        torch.save({**state, "extra": shared, "extra_config": ListConfig()}, tmp_path / "checkpoint.pt")
    read = load_pickled(tmp_path / "checkpoint.pt")
    assert read["extra"][0] is read["extra"][1] and read["extra_config"] is read["extra"]  # made once each
    for name in ("dict.en.txt", "dict.de.txt"):
        shutil.copy(FIXTURES / "post" / name, tmp_path)
    assert cli("import", tmp_path / "checkpoint.pt", "-o", tmp_path / "out.pt", "-s", "en", "-t", "de",
               "--tokenizer", "none").exit_code == 0
    inside: list = []
    inside.append(inside)  # an object that holds itself: no plain copy ends
    torch.save({**state, "extra": inside}, tmp_path / "itself.pt")
    with pytest.raises(NmtError, match=r"itself.pt: unreadable \(an object that holds itself\)$"):
        load_pickled(tmp_path / "itself.pt")
    state["model"]["encoder.embed_tokens.weight"] = torch.zeros(1).expand(2**16, 2**15)
    torch.save(state, tmp_path / "repeated.pt")
    refused = cli("import", tmp_path / "repeated.pt", "-o", tmp_path / "out2.pt", "-s", "en", "-t", "de",
                  "--tokenizer", "none")
    assert refused.exit_code == 1 and refused.output.count("\n") == 1
    assert "repeated.pt: unreadable (a tensor of shape (65536, 32768) over a storage of 4 bytes" in refused.output
    assert not (tmp_path / "out2.pt").exists()


@pytest.mark.parametrize("generation, message", [
    ({"beam": "x"}, "beam 'x': expected an integer of at least 1"),
    ({"beam": 4.7}, "beam 4.7: expected an integer of at least 1"),  # not cut to 4
    ({"lenpen": "long"}, "lenpen 'long': expected a number of at least 0"),
])
def test_a_generation_setting_of_the_wrong_kind_is_one_line(tmp_path, generation, message):
    with torch.serialization.safe_globals([argparse.Namespace]):
        state = torch.load(FIXTURES / "post" / "checkpoint.pt", weights_only=True)
    state["cfg"]["generation"] = {**(state["cfg"].get("generation") or {}), **generation}
    torch.save(state, tmp_path / "checkpoint.pt")
    for name in ("dict.en.txt", "dict.de.txt"):
        shutil.copy(FIXTURES / "post" / name, tmp_path)
    with pytest.raises(NmtError, match=f"checkpoint.pt: {re.escape(message)}$"):
        import_model(tmp_path / "checkpoint.pt", tmp_path / "out.pt", options=WORDS)
    state["cfg"]["generation"]["lenpen"], state["cfg"]["generation"]["beam"] = None, None  # null: fairseq's defaults
    torch.save(state, tmp_path / "checkpoint.pt")
    import_model(tmp_path / "checkpoint.pt", tmp_path / "out.pt", options=WORDS)
    from nmt_cli.model.checkpoint import load_bundle

    search = load_bundle(tmp_path / "out.pt").released.search
    assert search["beam"] == 5 and search["lenpen"] == 1.0
