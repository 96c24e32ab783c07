"""The `nmt` command's surface: help, version, info and unbuilt subcommands."""

import json

from click.testing import CliRunner

from nmt_cli import __version__
from nmt_cli.cli import main


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
