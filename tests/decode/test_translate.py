"""`nmt translate`: one line out per line in, order kept, long and empty lines, formats, atomic output."""

import json
import os
import select
import subprocess
import sys

import pytest
from builders import LINES, engine
from builders import run_translate as run
from click.testing import CliRunner
from conftest import tiny_checkpoint, write_lines

from nmt_cli.cli import main
from nmt_cli.config import SearchConfig
from nmt_cli.decode.translate import translate_lines
from nmt_cli.lines import arriving_chunks
from nmt_cli.run_config import RunConfig, TranslateConfig

PREFIXED = TranslateConfig(prefix=True)  # SOURCE<TAB>PREFIX lines


@pytest.fixture
def model_path(tmp_path):
    return tiny_checkpoint(tmp_path / "m.pt", seed=3)


def test_batched_equals_one_by_one_and_keeps_order(model_path):
    batched = translate_lines(engine(model_path), LINES)
    alone = [translate_lines(engine(model_path), [line])[0] for line in LINES]
    assert batched == alone and len(batched) == len(LINES)
    assert batched[1] == "" and batched[4] == ""
    assert len({out for out in batched if out}) >= 3  # outputs depend on the input: the order is checked
    small_batches = translate_lines(engine(model_path, max_tokens=8, batch_size=2), LINES)
    assert small_batches == batched


def test_cuda_graphs_are_refused_without_a_gpu(model_path):
    result = run("-m", model_path, "--device", "cpu", "--cuda-graphs", input="a b c\n")
    assert result.exit_code == 1 and result.output.strip() == "Error: --cuda-graphs needs a CUDA device, not cpu"


def test_line_longer_than_positions_is_truncated_with_a_warning(tmp_path):
    path = tiny_checkpoint(tmp_path / "short.pt", max_positions=8)
    warnings = []
    out = translate_lines(engine(path, warnings), ["a b", "a b c d e f g h i j k l", "c"], first_number=10)
    assert len(out) == 3
    assert warnings == ["warning: line 11: 12 tokens, more than the model's 7; translating the first 7"]


def test_jsonl_nbest_with_scores(model_path):
    t = engine(model_path, search=SearchConfig(beam=3, nbest=2, max_len_a=1, max_len_b=3))
    records = [json.loads(line) for line in translate_lines(t, ["a b c", ""], config=TranslateConfig(format="jsonl"))]
    assert [r["line"] for r in records] == [1, 2]
    first = records[0]
    assert len(first["nbest"]) == 2 and first["nbest"][0]["score"] >= first["nbest"][1]["score"]
    assert first["translation"] == first["nbest"][0]["text"]
    assert records[1] == {"line": 2, "translation": "", "nbest": []}


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
    import nmt_cli.decode.translate as tr

    write_lines(tmp_path / "in.txt", ["a b"] * 10)
    monkeypatch.setattr(tr, "CHUNK_LINES", 3)
    calls = []
    real = tr.translate_lines

    def fail_on_second_chunk(engine, lines, first_number, config):
        calls.append(first_number)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(engine, lines, first_number, config)

    monkeypatch.setattr(tr, "translate_lines", fail_on_second_chunk)
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
    assert engine(model_path, output_format="bpe").pipeline.text([5, 6]) == "b c"
    assert engine(model_path, input_format="bpe").pipeline.source_ids("a b zz", 1) == [4, 5, 3]


def test_attention_layer_out_of_range_and_mismatched_ensemble(model_path, tmp_path):
    result = run("-m", model_path, "--format", "jsonl", "--attention", "--attention-layer", 4, input="a b\n")
    assert result.exit_code == 1 and "--attention-layer 4: the model has 1 decoder layers" in result.output
    other = tiny_checkpoint(tmp_path / "other.pt", symbols="abcdefghijklmnoq")
    result = run("-m", model_path, "-m", other, input="a b\n")
    assert result.exit_code == 1 and "ensemble members must share their vocabularies" in result.output


@pytest.mark.slow
def test_a_co_process_is_answered_line_by_line(model_path):
    """A program that writes one line to a pipe and waits for its translation gets it (as from
    fairseq-interactive), and later lines follow; the output is what a file gives."""
    process = subprocess.Popen([sys.executable, "-m", "nmt_cli", "translate", "-m", str(model_path), "--device",
                                "cpu", "--threads", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL)
    answers = []
    try:
        for line in LINES[:3]:
            process.stdin.write(line.encode() + b"\n")
            process.stdin.flush()
            assert select.select([process.stdout], [], [], 60)[0], f"no answer to {line!r}: the pipe deadlocked"
            answers.append(process.stdout.readline().decode())
        process.stdin.close()
        assert process.wait(timeout=60) == 0 and process.stdout.read() == b""
    finally:
        process.kill()
    assert answers == run("-m", model_path, "--device", "cpu", input="\n".join(LINES[:3]) + "\n").output.splitlines(
        keepends=True)


def test_arriving_chunks_hand_on_what_came_before_a_pause():
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd, "rb", buffering=0) as source:
        chunks = arriving_chunks(source, "<stdin>", size=2, pause=0.05)
        with os.fdopen(write_fd, "wb", buffering=0) as sink:
            sink.write(b"a b\n")
            assert next(chunks) == ["a b"]  # alone: nothing else came
            sink.write(b"c\nd\ne\nf")  # three lines arrive at once, and the start of a fourth
            assert next(chunks) == ["c", "d"] and next(chunks) == ["e"]
            sink.write(b" g\n")
        assert list(chunks) == [["f g"]]


def test_prefixed_lines_start_with_their_prefix(model_path):
    t = engine(model_path, output_format="bpe", search=SearchConfig(beam=3, max_len_a=1, max_len_b=4))
    out = translate_lines(t, ["a b c\tn o", "p o n", "e f\t", "g h\tzzz k"], config=PREFIXED)
    assert out[0].split()[:2] == ["n", "o"]
    assert out[1] == translate_lines(engine(model_path, output_format="bpe",
                                search=SearchConfig(beam=3, max_len_a=1, max_len_b=4)), ["p o n"])[0]
    assert out[3].split()[:2] == ["<unk>", "k"]  # an unknown word in a prefix stays where it is


def test_a_prefix_the_vocabulary_lacks_is_warned_once_with_its_line(model_path):
    warnings = []
    t = engine(model_path, warnings, output_format="bpe")
    out = translate_lines(t, ["a b c\tn o", "p o n\tzzz ü k", "e f\tyyy"], first_number=7, config=PREFIXED)
    assert out[1].split()[:3] == ["<unk>", "<unk>", "k"]
    assert warnings == ["warning: line 8: the prefix has 'zzz', 'ü', which the model's vocabulary lacks: forced as "
                        "<unk> (warned once)"]


def test_an_empty_source_with_a_prefix_gives_the_prefix_and_says_so_once(model_path):
    warnings = []
    t = engine(model_path, warnings, output_format="bpe")
    out = translate_lines(t, ["a b\tn", "\tn o", " \tp", "\t", ""], first_number=3, config=PREFIXED)
    assert out[1:] == ["n o", "p", "", ""]
    assert warnings == ["warning: line 4: an empty source with a prefix: its output is the prefix alone (warned "
                        "once)"]


def test_sampling_from_the_command_line_is_seeded(model_path):
    def sampled(seed):
        result = CliRunner().invoke(main, ["translate", "-m", str(model_path), "--sampling",
                                           "--nbest", "3", "--seed", str(seed), "--format", "jsonl",
                                           "--device", "cpu"], input="a b c\np o n m\n")
        assert result.exit_code == 0, result.output
        return [[h["text"] for h in json.loads(line)["nbest"]] for line in result.output.splitlines()]

    first = sampled(1)
    assert first == sampled(1) and len(first) == 2 and all(len(samples) == 3 for samples in first)
    assert first != sampled(2)


def test_sampling_without_a_seed_says_the_seed_that_repeats_it(model_path):
    def sampled(*seed):
        result = CliRunner().invoke(main, ["translate", "-m", str(model_path), "--sampling", "--device", "cpu",
                                            *seed], input="a b c\np o n m\n")
        assert result.exit_code == 0, result.output
        return result.stdout, result.stderr

    out, said = sampled()
    seed = said.split("sampling with --seed ")[1].split()[0]
    assert sampled("--seed", seed) == (out, "")


def test_score_reference_prints_each_targets_log_probability(model_path):
    from nmt_cli.decode.translator import Translator as Api

    pairs = ["a b c\tc b a", "p o n\t", "\tq", "e f g\te f g h"]
    text = run("-m", model_path, "--score-reference", "--lenpen", 1.0, input="\n".join(pairs) + "\n")
    assert text.exit_code == 0, text.output
    api = Api.load(model_path, device="cpu", lenpen=1.0)
    expected = api.score([p.split("\t")[0] for p in pairs], [p.split("\t")[1] for p in pairs])
    assert text.stdout.splitlines() == [f"{s.log_prob:.6f}" for s in expected]
    jsonl = run("-m", model_path, "--score-reference", "--lenpen", 1.0, "--format", "jsonl",
                input="\n".join(pairs) + "\n")
    records = [json.loads(line) for line in jsonl.stdout.splitlines()]
    assert [r["line"] for r in records] == [1, 2, 3, 4] and records[1]["tokens"] == ["</s>"]  # an empty target
    assert records[0]["tokens"] == ["c", "b", "a", "</s>"] and len(records[0]["token_log_probs"]) == 4
    assert records[3]["score"] == pytest.approx(expected[3].log_prob / ((5 + 5) / 6), abs=1e-5)


@pytest.mark.parametrize("flags, stdin, code, message", [
    (["--score-reference"], "a b\tc\nno tab here\n", 1, "line 2: --score-reference reads SOURCE<TAB>TARGET lines"),
    (["--score-reference", "--beam", "5"], "a\tb\n", 2, "--beam applies only to translation, not with "
                                                      "--score-reference"),
    (["--score-reference", "--prefix"], "a\tb\n", 2, "--score-reference applies only without --prefix"),
])
def test_score_reference_refuses_what_it_cannot_do(model_path, flags, stdin, code, message):
    result = run("-m", model_path, *flags, input=stdin)
    assert result.exit_code == code and message in result.output, result.output


def test_a_file_on_a_terminal_shows_a_bar_of_its_total_and_the_terminal_is_told_it_is_read(model_path, tmp_path,
                                                                                          monkeypatch):
    """-i FILE -o FILE on a terminal: a bar of the file's lines (its total known, so an ETA);
    lines typed at a terminal: one line saying so. Counting lines: a last line without its
    newline counts, an empty file has none."""
    import io

    from nmt_cli.decode.translate import translate_file
    from nmt_cli.lines import line_count

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    write_lines(tmp_path / "in.txt", ["a b", "c d", "e"] * 3)
    for text, lines in (("", 0), ("a", 1), ("a\n", 1), ("a\n\nb", 3)):
        (tmp_path / "n.txt").write_text(text)
        assert line_count(tmp_path / "n.txt") == lines
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    on_the_cpu = TranslateConfig(RunConfig(device="cpu"))
    assert translate_file([model_path], tmp_path / "in.txt", tmp_path / "out.txt", on_the_cpu) == 9
    assert "9/9" in terminal.getvalue() and "line/s" in terminal.getvalue()
    monkeypatch.setattr("sys.stdin", Terminal("a b\n"))
    monkeypatch.setattr("sys.stdin.buffer", io.BytesIO(b"a b\n"), raising=False)
    monkeypatch.setattr("sys.stdout", io.StringIO())
    translate_file([model_path], None, None, on_the_cpu)
    assert "nmt translate: reading lines from the terminal (Ctrl-D ends)" in terminal.getvalue()


def test_off_a_terminal_a_long_translation_says_how_far_it_is(tmp_path, monkeypatch):
    """A log (no terminal, no bar) gets a line every minute: lines done of the file's, the time left."""
    from conftest import cli, tiny_checkpoint, write_lines

    from nmt_cli.decode import translate as translating

    assert translating.progress_line(100, 400, 50.0) == ("nmt translate: 100 of 400 lines in 0:00:50 (2.0 lines/s), "
                                                         "about 0:02:30 left")
    monkeypatch.setattr(translating, "PROGRESS_SECONDS", 0.0)
    monkeypatch.setattr(translating, "CHUNK_LINES", 2)
    write_lines(tmp_path / "in.txt", ["a b", "c", "d e f", "g", "h"])
    result = cli("translate", "-m", tiny_checkpoint(tmp_path / "m.pt"), "-i", tmp_path / "in.txt", "-o",
                 tmp_path / "out.txt", "--device", "cpu")
    assert result.exit_code == 0, result.output
    said = [line.split(" lines in ")[0] for line in result.stderr.splitlines() if line.startswith("nmt translate: ")]
    assert said == ["nmt translate: 2 of 5", "nmt translate: 4 of 5", "nmt translate: 5 of 5"]
