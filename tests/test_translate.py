"""`nmt translate`: one line out per line in, order kept, long and empty lines, formats, atomic output."""

import io
import json

import pytest
import torch
from click.testing import CliRunner
from conftest import tiny_checkpoint, write_lines

from nmt_cli import NmtError, kernels
from nmt_cli.checkpoint import load_bundle
from nmt_cli.cli import main
from nmt_cli.config import SearchConfig, TranslateConfig
from nmt_cli.search import Ensemble
from nmt_cli.translate import Translator, quantize_int8, translate_stream

LINES = ["a b c d", "", "p o n m l k", "e", "   ", "f g h i j k l m n o p a b c", "c c c", "h a"]


def translator(path, warnings=None, **options):
    search = options.pop("search", SearchConfig(beam=3, max_len_a=1, max_len_b=3))
    return Translator([load_bundle(path)], TranslateConfig(search=search, **options), torch.device("cpu"),
                      warn=(warnings.append if warnings is not None else None))


@pytest.fixture
def model_path(tmp_path):
    return tiny_checkpoint(tmp_path / "m.pt", seed=3)


def test_batched_equals_one_by_one_and_keeps_order(model_path):
    batched = translator(model_path).translate_lines(LINES)
    alone = [translator(model_path).translate_lines([line])[0] for line in LINES]
    assert batched == alone and len(batched) == len(LINES)
    assert batched[1] == "" and batched[4] == ""
    assert len({out for out in batched if out}) >= 3  # outputs depend on the input: the order is checked
    small_batches = translator(model_path, max_tokens=8, batch_size=2).translate_lines(LINES)
    assert small_batches == batched


def test_a_batch_the_gpu_has_no_memory_for_is_translated_in_halves(model_path, tmp_path, monkeypatch):
    from nmt_cli import translate

    expected = translator(model_path).translate_lines(LINES)
    searched, search = [], translate.beam_search

    def short_of_memory(models, src, *args):
        searched.append(src.size(0))
        if src.size(0) > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return search(models, src, *args)

    warnings = []
    halving = translator(model_path, warnings)
    halving.models = Ensemble(halving.models.models, graphs=True)  # as --cuda-graphs does on a GPU
    halving.translate_lines(LINES)
    assert [slots for slots, *_ in halving.models.graphs[0].decoders] == [8]
    monkeypatch.setattr(translate, "beam_search", short_of_memory)
    assert halving.translate_lines(LINES) == expected
    assert searched == [6, 3, 1, 2, 3, 1, 2]  # the 6 non-empty lines, then halves of halves
    assert [slots for slots, *_ in halving.models.graphs[0].decoders] == [1, 2]  # the 8-slot one was given back
    assert warnings == ["warning: CUDA out of memory for 6 sentences at once: translating such batches in halves "
                        "(a smaller --max-tokens avoids the retries)"]
    monkeypatch.setattr(translate, "beam_search", lambda *args: short_of_memory(*args[:1], args[1].repeat(3, 1)))
    write_lines(tmp_path / "in.txt", ["a b c"])
    result = run("-m", model_path, "-i", tmp_path / "in.txt", "-o", tmp_path / "out.txt")
    assert result.exit_code == 1 and not (tmp_path / "out.txt").exists()
    assert result.output.strip().splitlines()[-1] == ("Error: CUDA out of memory translating a single sentence of 3 "
                                                      "tokens; use a smaller --beam or --device cpu")


def test_cuda_graphs_are_refused_without_a_gpu(model_path):
    result = run("-m", model_path, "--device", "cpu", "--cuda-graphs", input="a b c\n")
    assert result.exit_code == 1 and result.output.strip() == "Error: --cuda-graphs needs a CUDA device, not cpu"


def test_line_longer_than_positions_is_truncated_with_a_warning(tmp_path):
    path = tiny_checkpoint(tmp_path / "short.pt", max_positions=8)
    warnings = []
    out = translator(path, warnings).translate_lines(["a b", "a b c d e f g h i j k l", "c"], first_number=10)
    assert len(out) == 3
    assert warnings == ["warning: line 11: 12 tokens, more than the model's 7; translating the first 7"]


def test_jsonl_nbest_with_scores(model_path):
    t = translator(model_path, format="jsonl", search=SearchConfig(beam=3, nbest=2, max_len_a=1, max_len_b=3))
    records = [json.loads(line) for line in t.translate_lines(["a b c", ""])]
    assert [r["line"] for r in records] == [1, 2]
    first = records[0]
    assert len(first["nbest"]) == 2 and first["nbest"][0]["score"] >= first["nbest"][1]["score"]
    assert first["translation"] == first["nbest"][0]["text"]
    assert records[1] == {"line": 2, "translation": "", "nbest": []}


def run(*args, **kwargs):
    return CliRunner().invoke(main, ["translate", *map(str, args)], **kwargs)


def test_cli_file_to_file(model_path, tmp_path):
    write_lines(tmp_path / "in.txt", LINES)
    result = run("-m", model_path, "-i", tmp_path / "in.txt", "-o", tmp_path / "out.txt", "--beam", 2)
    assert result.exit_code == 0, result.output
    assert len((tmp_path / "out.txt").read_text().split("\n")) == len(LINES) + 1
    assert not list(tmp_path.glob(".out.txt*"))


def test_cli_stdin_to_stdout_and_ensemble(model_path):
    one = run("-m", model_path, input="a b c\n\ne f\n")
    two = run("-m", model_path, "-m", model_path, input="a b c\n\ne f\n")
    assert one.exit_code == 0 and one.output == two.output and one.output.count("\n") == 3


def test_empty_input_gives_empty_output(model_path, tmp_path):
    (tmp_path / "empty").write_text("")
    result = run("-m", model_path, "-i", tmp_path / "empty", "-o", tmp_path / "out")
    assert result.exit_code == 0 and (tmp_path / "out").read_text() == ""


def test_failure_midway_leaves_no_output_file(model_path, tmp_path, monkeypatch):
    import nmt_cli.translate as tr

    write_lines(tmp_path / "in.txt", ["a b"] * 10)
    monkeypatch.setattr(tr, "CHUNK_LINES", 3)
    calls = []
    real = tr.Translator.translate_lines

    def fail_on_second_chunk(self, lines, first_number=1):
        calls.append(first_number)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, lines, first_number)

    monkeypatch.setattr(tr.Translator, "translate_lines", fail_on_second_chunk)
    result = run("-m", model_path, "-i", tmp_path / "in.txt", "-o", tmp_path / "out.txt")
    assert result.exit_code != 0 and calls == [1, 4]
    assert not (tmp_path / "out.txt").exists() and not list(tmp_path.glob(".out.txt*"))


def test_invalid_utf8_input_names_the_line(model_path, tmp_path):
    (tmp_path / "in.txt").write_bytes(b"a b\nc \xfe d\n")
    result = run("-m", model_path, "-i", tmp_path / "in.txt", "-o", tmp_path / "out.txt")
    assert result.exit_code == 1 and "in.txt:2: invalid UTF-8" in result.output
    assert not (tmp_path / "out.txt").exists()


@pytest.mark.parametrize("args,flag", [(["--beam", "0"], "--beam"), (["--beam", "-1"], "--beam"),
                                       (["--nbest", "5", "--beam", "2"], "--nbest"), (["--lenpen", "-1"], "--lenpen")])
def test_options_out_of_range(model_path, args, flag):
    result = run("-m", model_path, *args, input="a\n")
    assert result.exit_code == 2 and flag in result.output


def test_output_formats(model_path):
    t = translator(model_path, output_format="bpe")
    assert t.detokenize([5, 6]) == "b c"
    assert translator(model_path, input_format="bpe").encode("a b zz", 1) == [4, 5, 3]


def test_attention_layer_out_of_range_and_mismatched_ensemble(model_path, tmp_path):
    result = run("-m", model_path, "--format", "jsonl", "--attention", "--attention-layer", 4, input="a b\n")
    assert result.exit_code == 1 and "--attention-layer 4: the model has 1 decoder layers" in result.output
    other = tiny_checkpoint(tmp_path / "other.pt", symbols="abcdefghijklmnoq")
    result = run("-m", model_path, "-m", other, input="a b\n")
    assert result.exit_code == 1 and "ensemble members must share their vocabularies" in result.output


def test_quantize_int8_replaces_every_linear_layer_and_stays_close(model_path):
    fp32, int8 = translator(model_path), translator(model_path, quantize="int8")
    model = int8.models.models[0]
    assert not any(type(m) is torch.nn.Linear for m in model.modules())
    assert isinstance(model.int8_projection, torch.ao.nn.quantized.dynamic.Linear)
    assert int8.models.projections[0] == model.project  # the search projects in int8 too
    src = torch.tensor([[5, 6, 7, 8, 2]])
    tgt = torch.tensor([[1, 9, 10, 11]])
    with torch.inference_mode():
        reference = fp32.models.models[0](src, tgt).log_softmax(-1)
        quantized = model(src, tgt).log_softmax(-1)
    assert (quantized - reference).abs().max() < 0.1
    assert not torch.equal(quantized, reference)  # it did change the arithmetic
    assert len(int8.translate_lines(LINES)) == len(LINES)


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

    def unavailable(_model):
        raise ImportError("No module named 'torch.ao.quantization'")

    monkeypatch.setattr(kernels, "quantize_int8", unavailable)
    with pytest.raises(NmtError, match=r"--quantize int8: this PyTorch cannot quantize on this CPU \(No module"):
        quantize_int8(model, torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("terminal", [False, True])
def test_lines_typed_at_a_terminal_are_translated_one_at_a_time(model_path, terminal):
    class Source(io.BytesIO):
        def isatty(self) -> bool:
            return terminal

    model = translator(model_path, input_format="bpe")
    chunks = []
    translate_lines = model.translate_lines
    model.translate_lines = lambda lines, first: chunks.append(len(lines)) or translate_lines(lines, first)
    out = []
    assert translate_stream(model, Source(b"a b\nc d\ne\n"), "<stdin>", out.append) == 3
    assert chunks == ([1, 1, 1] if terminal else [3])
    assert out == [line + "\n" for line in translate_lines(["a b", "c d", "e"], 1)]


def test_prefixed_lines_start_with_their_prefix(model_path):
    t = translator(model_path, prefix=True, output_format="bpe",
                   search=SearchConfig(beam=3, max_len_a=1, max_len_b=4))
    out = t.translate_lines(["a b c\tn o", "p o n", "e f\t", "g h\tzzz k"])
    assert out[0].split()[:2] == ["n", "o"]
    assert out[1] == translator(model_path, output_format="bpe",
                                search=SearchConfig(beam=3, max_len_a=1, max_len_b=4)).translate_lines(["p o n"])[0]
    assert out[3].split()[:2] == ["<unk>", "k"]  # an unknown word in a prefix stays where it is


def test_sampling_from_the_command_line_is_seeded(model_path):
    def sampled(seed):
        result = CliRunner().invoke(main, ["translate", "-m", str(model_path), "--sampling", "--beam", "1",
                                           "--nbest", "3", "--seed", str(seed), "--format", "jsonl",
                                           "--device", "cpu"], input="a b c\np o n m\n")
        assert result.exit_code == 0, result.output
        return [[h["text"] for h in json.loads(line)["nbest"]] for line in result.output.splitlines()]

    first = sampled(1)
    assert first == sampled(1) and len(first) == 2 and all(len(samples) == 3 for samples in first)
    assert first != sampled(2)
