"""The generator: ids in, hypotheses out; a batch the device has no memory for is searched in
halves; int8 quantization on the CPU; an ensemble's scores against its members' averaged
probabilities written out."""

import copy

import pytest
import torch
from builders import LINES, averaged_log_probs, engine, random_model, sources
from builders import run_translate as run
from click.testing import CliRunner
from conftest import tiny_checkpoint, write_lines

from nmt_cli.cli import main
from nmt_cli.config import SearchConfig
from nmt_cli.decode import generator
from nmt_cli.decode.ensemble import Ensemble
from nmt_cli.decode.generator import Generator
from nmt_cli.decode.translate import translate_lines
from nmt_cli.errors import NmtError
from nmt_cli.model.checkpoint import load_bundle
from nmt_cli.model.kernels import quantize_int8
from nmt_cli.text.vocab import BOS_ID, EOS_ID


@pytest.fixture
def model_path(tmp_path):
    return tiny_checkpoint(tmp_path / "m.pt", seed=3)


def sources_of(model_path) -> list[list[int]]:
    pipeline = engine(model_path).pipeline
    return [pipeline.source_ids(line, k + 1) for k, line in enumerate(LINES)]


def test_a_batch_the_gpu_has_no_memory_for_is_searched_in_halves(model_path, tmp_path, monkeypatch):
    sources, config = sources_of(model_path), SearchConfig(beam=3, max_len_a=1, max_len_b=3)
    expected = Generator([load_bundle(model_path).model], torch.device("cpu"), max_tokens=8000).search(sources, config)
    searched, search = [], generator.beam_search

    def short_of_memory(models, src, *args):
        searched.append(src.size(0))
        if src.size(0) > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return search(models, src, *args)

    warnings = []
    halving = Generator([load_bundle(model_path).model], torch.device("cpu"), max_tokens=8000, warn=warnings.append)
    halving.models = Ensemble(halving.models.models, graphs=True)  # as --cuda-graphs does on a GPU
    halving.search(sources, config)
    assert [slots for slots, *_ in halving.models.graphs[0].decoders] == [8]
    monkeypatch.setattr(generator, "beam_search", short_of_memory)
    tokens = [[h.tokens for h in hyps] for hyps in expected]
    assert [[h.tokens for h in hyps] for hyps in halving.search(sources, config)] == tokens
    fitted = [n for n in searched if n <= 2]  # the searches that fit: each sentence in exactly one
    assert searched[0] == 6 and sum(fitted) == 6 and len(searched) > len(fitted)
    assert [slots for slots, *_ in halving.models.graphs[0].decoders] == [1, 2]  # the 8-slot one was given back
    assert warnings == ["warning: CUDA out of memory for 6 sentences at once: translating such batches in halves "
                        "(a smaller --max-tokens avoids the retries)"]
    monkeypatch.setattr(generator, "beam_search", lambda *args: short_of_memory(*args[:1], args[1].repeat(3, 1)))
    write_lines(tmp_path / "in.txt", ["a b c"])
    result = run("-m", model_path, "-i", tmp_path / "in.txt", "-o", tmp_path / "out.txt")
    assert result.exit_code == 1 and not (tmp_path / "out.txt").exists()
    assert result.output.strip().splitlines()[-1] == ("Error: CUDA out of memory translating a single sentence of 3 "
                                                      "tokens; use a smaller --beam or --device cpu")


def test_quantize_int8_replaces_every_linear_layer_and_stays_close(model_path):
    fp32, int8 = engine(model_path).generator, engine(model_path, quantize="int8").generator
    model = int8.models.models[0]
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert isinstance(model.output_projection, torch.ao.nn.quantized.dynamic.Linear)
    assert int8.models.projections[0] is model.output_projection  # the search projects in int8 too
    assert model.tgt_embed.tokens.weight.dtype == torch.float32  # the embeddings stay float
    src = torch.tensor([[5, 6, 7, 8, 2]])
    tgt = torch.tensor([[1, 9, 10, 11]])
    with torch.inference_mode():
        reference = fp32.models.models[0](src, tgt).log_softmax(-1)
        quantized = model(src, tgt).log_softmax(-1)
    assert (quantized - reference).abs().max() < 0.1
    assert not torch.equal(quantized, reference)  # it did change the arithmetic
    assert len(translate_lines(engine(model_path, quantize="int8"), LINES)) == len(LINES)


def test_quantize_int8_cli_and_refused_off_cpu_fp32(model_path):
    result = CliRunner().invoke(main, ["translate", "-m", str(model_path), "--quantize", "int8", "--device", "cpu",
                                       "--input-format", "bpe"], input="a b c\nd e\n")
    assert result.exit_code == 0, result.output
    assert len(result.output.splitlines()) == 2
    model = load_bundle(model_path).model
    for device, dtype in ((torch.device("cuda"), torch.float32), (torch.device("cpu"), torch.bfloat16)):
        with pytest.raises(NmtError, match="--quantize int8 runs on the CPU in fp32"):
            quantize_int8(model, device, dtype)


def test_quantize_int8_failure_of_torch_is_a_clear_error(model_path, monkeypatch):
    model = load_bundle(model_path).model

    def unavailable(*args, **kwargs):
        raise ImportError("No module named 'torch.ao.quantization'")

    monkeypatch.setattr("torch.ao.quantization.quantize_dynamic", unavailable)
    with pytest.raises(NmtError, match=r"--quantize int8: this PyTorch cannot quantize on this CPU \(No module"):
        quantize_int8(model, torch.device("cpu"), torch.float32)


def test_an_ensemble_scores_with_its_members_averaged_probabilities():
    a, b = random_model(12, 2, scale=3.0), random_model(12, 9, scale=3.0)
    pairs = [([4, 5, 6, 7], [5, 6]), ([8, 9], [7, 8, 9, 10]), ([11], [])]
    expected = [[averaged_log_probs([a, b], sources([src], 12), [BOS_ID] + tgt)[k, y].item()
                 for k, y in enumerate(tgt + [EOS_ID])] for src, tgt in pairs]
    generator = Generator([copy.deepcopy(a), copy.deepcopy(b)], torch.device("cpu"), max_tokens=1000)
    scored = generator.score([src for src, _ in pairs], [tgt for _, tgt in pairs])
    assert [len(s) for s in scored] == [len(e) for e in expected]
    assert [lp for s in scored for lp in s] == pytest.approx([lp for e in expected for lp in e], abs=1e-4)
