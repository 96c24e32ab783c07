"""The `nmt` command's surface: help, version, info, flags generated from the configs, and the
habits users bring from fairseq."""

import dataclasses
import json

import click
import pytest
from click.testing import CliRunner
from conftest import synthetic_data_dir, tiny_checkpoint

from nmt_cli.cli import main
from nmt_cli.config import PreprocessConfig, SearchConfig, TextConfig, TrainConfig
from nmt_cli.model import checkpoint as ckpt
from nmt_cli.run_config import RunConfig, TranslateConfig
from nmt_cli.version import __version__


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_help_lists_every_subcommand():
    result = run("--help")
    assert result.exit_code == 0
    for name in ["preprocess", "train", "average-checkpoints", "translate", "score", "info"]:
        assert name in result.output


def test_version():
    assert __version__ in run("--version").output


def test_info_json_counts_and_paper_row():
    result = run("info", "--arch", "base", "--vocab-size", "37000", "--json")
    info = json.loads(result.output)
    assert info["parameters"] == 63_082_496 and info["paper_parameters_m"] == 65


def test_info_overrides_use_table3_flag_names():
    result = run("info", "--encoder-layers", "2", "--decoder-layers", "2", "--json")
    info = json.loads(result.output)
    assert info["paper_row"] == "(C) N=2" and info["config"]["encoder_layers"] == 2
    info = json.loads(run("info", "--arch", "small", "--positions", "learned", "--norm", "pre",
                          "--d-k", "16", "--d-v", "8", "--max-positions", "64", "--json").output)
    assert info["config"]["d_v"] == 8 and info["paper_row"] is None


def test_info_table_shows_both_counts():
    result = run("info", "--arch", "big")
    assert "big: 213M" in result.output
    assert result.exit_code == 0


def test_out_of_range_option_names_the_option():
    result = run("info", "--dropout", "1.5")
    assert result.exit_code == 2 and "--dropout" in result.output
    result = run("info", "--d-model", "100")
    assert result.exit_code == 2 and "divisible" in result.output


@pytest.mark.parametrize("command, classes", [
    ("translate", (SearchConfig, RunConfig, TranslateConfig)),
    ("preprocess", (TextConfig, PreprocessConfig)),
    ("train", (TrainConfig,)),
])
def test_flags_are_generated_from_the_config_fields(command, classes):
    """Every field with help is a flag with the field's default, written once (in config.py)."""
    params = {p.name: p for p in main.commands[command].params}
    for cls in classes:
        for f in dataclasses.fields(cls):
            if "help" not in f.metadata:
                assert f.name not in params, f.name
                continue
            param = params[f.name]
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if f.type in (bool, "bool") and "negation" not in f.metadata:
                assert param.is_flag and default is False, f.name
            elif default is dataclasses.MISSING:
                assert param.required, f.name
            else:
                assert param.default == default, f.name


def test_translate_precision_defaults_to_auto_like_train():
    params = {p.name: p for p in main.commands["translate"].params}
    assert params["precision"].default == "auto" == TrainConfig().precision


def test_nbest_in_text_output_is_refused(tmp_path):
    model = tiny_checkpoint(tmp_path / "m.pt")
    result = run("translate", "-m", str(model), "--beam", "3", "--nbest", "2", "--device", "cpu")
    assert result.exit_code == 2 and "--nbest 2 needs --format jsonl" in result.output
    result = run("translate", "-m", str(model), "--beam", "2", "--nbest", "3", "--format", "jsonl")
    assert result.exit_code == 2 and "--nbest 3 is larger than --beam 2" in result.output


@pytest.mark.parametrize("flags, message", [
    (["--lr", "5e-4"], "--lr applies only with --lr-schedule inverse-sqrt or linear (the default noam schedule"),
    (["--lr-schedule", "inverse-sqrt", "--lr-scale", "2"], "--lr-scale applies only to the noam schedule (eq. 3)"),
    (["--lr-schedule", "linear", "--lr", "1e-3"], "--lr-schedule linear decays to 0 at the end of training: give "
     "--max-updates or --max-time"),
])
def test_a_rate_flag_the_schedule_ignores_is_refused(tmp_path, flags, message):
    data = synthetic_data_dir(tmp_path, n_train=20, n_valid=4)
    result = run("train", str(data), "--save-dir", str(tmp_path / "ck"), "--arch", "small", *flags)
    assert result.exit_code == 2 and message in result.output
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize("form", ["fairseq", "repeated", "plain"])
def test_average_checkpoints_takes_paths_in_every_form(tmp_path, form):
    a, b = tiny_checkpoint(tmp_path / "a.pt", seed=1), tiny_checkpoint(tmp_path / "b.pt", seed=2)
    paths = {"fairseq": ["--inputs", a, b], "repeated": ["--inputs", a, "--inputs", b], "plain": [a, b]}[form]
    result = run("average-checkpoints", *map(str, paths), "-o", str(tmp_path / "avg.pt"))
    assert result.exit_code == 0, result.output
    assert "averaged 2 checkpoints" in result.output
    assert [entry["path"] for entry in ckpt.load(tmp_path / "avg.pt")["averaged_from"]] == [str(a), str(b)]


def test_help_shows_every_command_whole_on_80_columns():
    result = CliRunner().invoke(main, ["--help"], terminal_width=80)
    commands = result.output.split("Commands:")[1].strip().splitlines()
    assert len(commands) == len(main.commands) and not [line for line in commands if line.endswith("...")]


def numeric_options(command: str) -> list[click.Option]:
    return [p for p in main.commands[command].params if isinstance(p.type, (click.IntRange, click.FloatRange))]


def required_arguments(command: str, tmp_path) -> list[str]:
    model = str(tiny_checkpoint(tmp_path / "m.pt"))
    return {"translate": ["-m", model], "serve": ["-m", model], "train": [str(tmp_path), "--save-dir", "ck"],
            "preprocess": ["-s", "a", "-t", "b", "--destdir", "d"]}[command]


@pytest.mark.parametrize("command", ["translate", "serve", "train", "preprocess"])
def test_no_number_option_takes_nan_inf_or_a_huge_value(tmp_path, command):
    """Every number flag is parsed by the one check of config.knob_problem: NaN and infinities are
    refused for floats, values past the range (10**30 for integers, say) for both."""
    options = numeric_options(command)
    assert len(options) >= {"translate": 12, "serve": 10, "train": 30, "preprocess": 8}[command]
    for option in options:
        floats = isinstance(option.type, click.FloatRange)
        for value in ("nan", "inf", "-inf") if floats else (str(10**30), str(-10**30)):
            result = run(command, *required_arguments(command, tmp_path), option.opts[-1], value)
            assert result.exit_code == 2 and f"Invalid value for '{option.opts[-1]}'" in result.output, \
                (option.opts, value, result.output)
            assert "must be" in result.output.splitlines()[-1] and "Traceback" not in result.output


@pytest.mark.parametrize("command, flags, message", [
    ("translate", ["--seed", "5"], "--seed applies only with --sampling"),
    ("translate", ["--sampling-topk", "5"], "--sampling-topk applies only with --sampling"),
    ("translate", ["--temperature", "0.5"], "--temperature applies only with --sampling"),
    ("translate", ["--sampling", "--beam", "5"], "--beam applies only to beam search, not with --sampling"),
    ("translate", ["--attention"], "--attention applies only with --format jsonl"),
    ("translate", ["--format", "jsonl", "--attention-layer", "1"], "--attention-layer applies only with --attention"),
    ("translate", ["--layers", "1"], "--layers applies only with --attention-plot"),
    ("preprocess", ["--subword", "sentencepiece", "--bpe-merges", "100"],
     "--bpe-merges applies only to --subword bpe"),
    ("preprocess", ["--subword", "sentencepiece", "--vocab-size", "100", "--tokenizer", "none"],
     "--tokenizer applies only to --subword bpe"),
    ("preprocess", ["--subword", "sentencepiece", "--sentencepiece-model", "SELF", "--vocab-size", "50"],
     "--vocab-size applies only without --sentencepiece-model or --srcdict"),
    ("preprocess", ["--srcdict", "SELF", "--vocab-min-count", "2"], "--vocab-min-count applies only without --srcdict"),
    ("preprocess", ["--subword", "sentencepiece", "--vocab-size", "100", "--sentencepiece-alpha", "0.5"],
     "--sentencepiece-alpha applies only with --sentencepiece-samples"),
    ("train", ["--eval-bleu-beam", "5"], "--eval-bleu-beam applies only with --eval-bleu"),
    ("train", ["--compile-mode", "reduce-overhead"], "--compile-mode applies only with --compile"),
    ("train", ["--compile", "--compile-mode", "reduce-overhead"],
     "--compile-mode reduce-overhead records a CUDA graph for each batch shape: give --length-buckets N"),
])
def test_a_flag_that_would_be_ignored_is_refused(tmp_path, command, flags, message):
    some_file = tiny_checkpoint(tmp_path / "m.pt")
    flags = [str(some_file) if flag == "SELF" else flag for flag in flags]
    result = run(command, *required_arguments(command, tmp_path), *flags)
    assert result.exit_code == 2 and message in result.output, result.output


def test_export_says_its_default_quantizations_among_the_choices():
    quantization = next(p for p in main.commands["export"].params if p.name == "quantization")
    assert "[default: float32; argos: int8" in quantization.help
    assert {"float32", "int8"} <= set(quantization.type.choices)
