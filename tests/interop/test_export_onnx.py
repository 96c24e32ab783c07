"""`nmt export --format onnx`: onnxruntime gives the model's logits from the graphs (a target's
prefix at once, and step by step over the cached keys and values, with the merged decoder too,
as transformers.js runs it: an empty past first), and searches over them give `nmt translate`'s
lines: greedy as a caller of the graphs writes it (each step from the last's presents), beam 4 as
the search written out (builders.reference_beam_search). On a model imported from OpenNMT-py
(pre-norm, sources without </s>, separate vocabularies, SentencePiece, its own beam rules): the
layouts the export has to carry that a model trained here has not."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from builders import OnnxGraphs, reference_beam_search
from conftest import cli, multi30k_lines, tiny_checkpoint

from nmt_cli.decode.translator import Translator
from nmt_cli.text.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
ONMT = Path(__file__).resolve().parent.parent / "fixtures" / "onmt" / "spm"


class Graphs(OnnxGraphs):
    """The exported graphs, and the logits of (source, target prefix) from them: a model for the
    written-out search."""

    def __call__(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        memory, mask = self.encode(src.numpy())
        out = self.run("decoder_model", input_ids=tgt.numpy(), encoder_attention_mask=mask,
                       encoder_hidden_states=memory)
        return torch.from_numpy(out["logits"])


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Path, Graphs]:
    tmp = tmp_path_factory.mktemp("onnx")
    model = tmp / "m.pt"
    assert cli("import", ONMT / "model_step_400.pt", "-o", model, "-s", "en", "-t", "de", "--sentencepiece",
               ONMT / "spm.model").exit_code == 0
    result = cli("export", "-m", model, "--format", "onnx", "-o", tmp / "onnx-export")
    assert result.exit_code == 0, result.output
    return model, Graphs(tmp / "onnx-export", names=(*Graphs.GREEDY, "decoder_model_merged"))


def sources_of(model: Path) -> tuple[Translator, torch.Tensor]:
    """Multi30k lines as the model's padded source ids, ending in </s> where config.json's
    add_source_eos says so."""
    translator = Translator.load(model, device="cpu")
    pipeline = translator.engine.pipeline
    lines = multi30k_lines(8, "en", "val")
    end = [EOS_ID] if translator.engine.generator.models.models[0].config.source_eos else []
    ids = [pipeline.source_ids(line, k) + end for k, line in enumerate(lines)]
    longest = max(map(len, ids))
    return translator, torch.tensor([row + [PAD_ID] * (longest - len(row)) for row in ids])


@pytest.mark.slow
def test_the_graphs_give_the_models_logits(exported):
    model, graphs = exported
    translator, src = sources_of(model)
    network = translator.engine.generator.models.models[0]
    tgt = torch.cat([torch.full((src.size(0), 1), BOS_ID), src[:, :5].clamp(min=4)], dim=1)
    with torch.no_grad():
        theirs = network(src, tgt)
    assert (graphs(src, tgt) - theirs).abs().max() < 1e-4  # a prefix at once
    lacked, unknown = src.clone(), src.clone()  # an id past the vocabulary (a piece tokenizer.json has) is <unk>
    lacked[0, 0], unknown[0, 0] = len(translator.engine.pipeline.src_vocab) + 3, UNK_ID
    assert np.array_equal(graphs.encode(lacked.numpy())[0], graphs.encode(unknown.numpy())[0])
    memory, mask = graphs.encode(src.numpy())
    out = graphs.run("decoder_model", input_ids=tgt[:, :1].numpy(), encoder_attention_mask=mask,
                     encoder_hidden_states=memory)
    for t in range(tgt.size(1)):  # and step by step, each from the last step's presents
        assert np.abs(out["logits"][:, 0] - theirs[:, t].numpy()).max() < 1e-4
        if t + 1 < tgt.size(1):
            past = {name.replace("present", "past_key_values"): value for name, value in out.items()
                    if name.startswith("present")}
            out = {**out, **graphs.run("decoder_with_past_model", input_ids=tgt[:, t + 1:t + 2].numpy(),
                                       encoder_attention_mask=mask, **past)}
    layers = sum(name.endswith(".decoder.key") for name in out)  # the merged graph, as transformers.js runs it:
    past = {f"past_key_values.{i}.{side}.{part}": np.zeros((src.size(0), network.config.heads, 0, network.config.d_k),
                                                          np.float32)  # empty at the first step
            for i in range(layers) for side in ("decoder", "encoder") for part in ("key", "value")}
    for t in range(tgt.size(1)):
        out = graphs.run("decoder_model_merged", input_ids=tgt[:, t:t + 1].numpy(), encoder_attention_mask=mask,
                         encoder_hidden_states=memory, use_cache_branch=np.array([t > 0]), **past)
        assert np.abs(out["logits"][:, 0] - theirs[:, t].numpy()).max() < 1e-4
        past = {name.replace("present", "past_key_values"): value for name, value in out.items()
                if name.startswith("present")}


@pytest.mark.slow
def test_searches_over_the_graphs_give_nmt_translates_lines(exported):
    model, graphs = exported
    translator, src = sources_of(model)
    search = translator.config.search
    limit = 12
    network = translator.engine.generator.models.models[0]
    rows = [row[(row != PAD_ID) & (row != EOS_ID)].tolist() for row in src]  # the search adds </s> itself
    greedy = dataclasses.replace(search, beam=1, max_len_a=0.0, max_len_b=limit, at_limit="cut")
    banned = [PAD_ID, BOS_ID] + ([] if search.allow_unk else [UNK_ID])
    found = translator.engine.generator.search(rows, greedy)
    assert graphs.greedy(src.numpy(), [limit] * src.size(0), banned) == [hyps[0].tokens for hyps in found]
    beam = dataclasses.replace(search, beam=4, max_len_a=0.0, max_len_b=limit)
    found = translator.engine.generator.search(rows, beam)
    for k in range(src.size(0)):
        row = src[k:k + 1, : int((src[k] != PAD_ID).sum())]
        expected = reference_beam_search(graphs, row, beam, max_positions=network.config.max_positions)
        assert found[k][0].tokens == expected[0][2]


@pytest.mark.slow
def test_the_export_says_how_to_use_it(exported):
    """The graphs, the ids of the specials, each side's tokens by id, and the text pipeline's files."""
    model, graphs = exported
    bundle = Translator.load(model, device="cpu").engine.pipeline
    folder = graphs.folder
    assert sorted(p.name for p in (folder / "onnx").iterdir()) == ["decoder_model.onnx", "decoder_model_merged.onnx",
                                                                 "decoder_with_past_model.onnx", "encoder_model.onnx"]
    config = json.loads((folder / "config.json").read_text())
    assert (config["decoder_start_token_id"], config["eos_token_id"], config["pad_token_id"]) == (BOS_ID, EOS_ID,
                                                                                                  PAD_ID)
    network = Translator.load(model, device="cpu").engine.generator.models.models[0].config
    assert config["model_type"] == "marian" and config["add_source_eos"] == network.source_eos  # transformers.js's
    assert (config["decoder_layers"], config["decoder_attention_heads"], config["d_model"]) == (
        network.decoder_layers, network.heads, network.d_model)  # the shapes of an empty past
    assert json.loads((folder / "generation_config.json").read_text())["decoder_start_token_id"] == BOS_ID
    assert not (folder / "tokenizer.json").exists()  # separate vocabularies: for onnxruntime only
    if bundle.src_vocab is bundle.tgt_vocab:
        assert json.loads((folder / "shared_vocabulary.json").read_text()) == bundle.tgt_vocab.tokens
    else:
        assert json.loads((folder / "source_vocabulary.json").read_text()) == bundle.src_vocab.tokens
        assert json.loads((folder / "target_vocabulary.json").read_text()) == bundle.tgt_vocab.tokens
    assert (folder / "nmt-cli.json").is_file()


def test_the_graphs_are_quantized_to_int8_or_not_at_all(tmp_path):
    result = cli("export", "-m", tiny_checkpoint(tmp_path / "m.pt"), "--format", "onnx", "--quantize", "float16", "-o",
                 tmp_path / "onnx")
    assert result.exit_code != 0 and "--quantize float32 or int8" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "onnx").exists()
