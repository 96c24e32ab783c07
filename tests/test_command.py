"""Every command's --config FILE (YAML, the command line overriding it), --dump-config, and its
reference page named in --help."""

import json
from pathlib import Path

import click
import pytest
import yaml
from conftest import cli, synthetic_data_dir, tiny_checkpoint

from nmt_cli.cli import main

ROOT = Path(__file__).resolve().parent.parent


def commands(group: click.Group = main, prefix: str = "") -> dict[str, click.Command]:
    found = {}
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found.update(commands(command, f"{prefix}{name} "))
        else:
            found[prefix + name] = command
    return found


@pytest.mark.parametrize("name", sorted(commands()))
def test_every_command_takes_a_config_file_and_names_its_page(name):
    result = cli(*name.split(), "--help")
    assert result.exit_code == 0 and "--config FILE" in result.output and "--dump-config" in result.output
    page = result.output.rsplit("Reference: ", 1)[1].split()[0]
    assert (ROOT / page).is_file(), page


def test_a_config_file_sets_options_and_the_command_line_overrides_it(tmp_path):
    model = tiny_checkpoint(tmp_path / "m.pt")
    lines = "a b c d\np o n m l k\nf g h i j k l\n"
    config = tmp_path / "search.yaml"
    config.write_text("beam: 1\nmax_len_b: 3\nmax-len-a: 0\n")  # dashes or underscores
    by_flags = cli("translate", "-m", model, "--device", "cpu", "--beam", 1, "--max-len-b", 3, "--max-len-a", 0,
                   input=lines)
    by_file = cli("translate", "-m", model, "--device", "cpu", "--config", config, input=lines)
    assert by_file.exit_code == 0 and by_file.stdout == by_flags.stdout
    overridden = cli("translate", "-m", model, "--device", "cpu", "--config", config, "--max-len-b", 6, input=lines)
    assert overridden.stdout == cli("translate", "-m", model, "--device", "cpu", "--beam", 1, "--max-len-b", 6,
                                    "--max-len-a", 0, input=lines).stdout != by_file.stdout
    config.write_text(f"model: [{model}]\ndevice: cpu\nsampling: true\nbeam: 2\n")  # a setting that does not apply
    refused = cli("translate", "--config", config, input=lines)
    assert refused.exit_code == 2 and "beam applies only to beam search" in refused.output


@pytest.mark.parametrize("text, message", [
    ("max-tokens: 100\nbogus_option: 1\n", "{path}:2: 'bogus_option' is not an option of `nmt train` "
                                           "(see nmt train --help)"),
    # a value is taken as its flag's text would be: not cut, not made a number from true, not a traceback
    ("max-tokens: 4.7\n", "{path}:1: max-tokens: '4.7' is not a valid integer."),
    ("seed: 1\nmax-tokens: true\n", "{path}:2: max-tokens: 'true' is not a valid integer."),
    ("max-tokens: [4, 5]\n", "{path}:1: max-tokens: a list, where the option takes one value"),
    ("max-tokens: {a: 1}\n", "{path}:1: max-tokens: a mapping, where the option takes one value"),
    ("seed: 2024-01-01\n", "{path}:1: seed: '2024-01-01' is not a valid integer."),
    ("save-dir: null\n", "{path}:1: save-dir: no value (null): give one, or leave the option out"),
    ("[" * 5000 + "]" * 5000 + "\n", "{path}: nested too deeply to be a file of options"),
    ("max-tokens: [1\n", "{path}:2: not a YAML file (expected ',' or ']', but got '<stream end>')"),
    ("- max-tokens\n", "{path}: expected option: value lines (a YAML mapping), got a list"),
    # an alias could expand a small file without bound; a key given twice would silently win
    ("a: &x [1]\nmax-tokens: *x\n", "{path}:2: not a YAML file (an alias (*name): a file of options spells out "
                                     "each value)"),
    ("max-tokens: 100\nseed: 1\nmax_tokens: 200\n", "{path}:3: 'max_tokens' again (first on line 1): give each "
                                                    "option once"),
    ("max-tokens: 1:30\n", "{path}:1: max-tokens: '1:30' is not a valid integer."),  # YAML 1.1's 90
])
def test_a_bad_config_file_is_one_line_naming_it(tmp_path, text, message):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    result = cli("train", tmp_path, "--save-dir", tmp_path / "ckpt", "--config", path)
    assert result.exit_code == 1 and result.output == f"Error: {message.format(path=path)}\n"
    assert not (tmp_path / "ckpt").exists()


def test_values_are_their_text_and_later_files_override_earlier_ones(tmp_path):
    """YAML 1.1 would make `010` the number 8 and `no` false: a file says what its flag's text
    would; with two --config files, the second's option wins and the first's others stay."""
    model = tiny_checkpoint(tmp_path / "m.pt")
    first, second = tmp_path / "first.yaml", tmp_path / "second.yaml"
    first.write_text("beam: 010\nmax-len-b: 3\nlenpen: 1\n")
    second.write_text("max-len-b: 010\n")
    dumped = cli("translate", "-m", model, "--config", first, "--config", second, "--dump-config")
    assert dumped.exit_code == 0, dumped.output
    assert "beam: 10\n" in dumped.output and "max-len-b: 10\n" in dumped.output and "lenpen: 1.0\n" in dumped.output
    (tmp_path / "langs.yaml").write_text("source-lang: no\ntarget-lang: 'off'\n")
    dumped = cli("preprocess", "--config", tmp_path / "langs.yaml", "--dump-config")
    assert "source-lang: 'no'\n" in dumped.output and "target-lang: 'off'\n" in dumped.output


def test_the_dumped_configuration_reads_back_and_trains(tmp_path):
    """--dump-config prints every option, defaults included, under its long name; read back as
    --config it is the same run (defaults that would not apply are not taken as given)."""
    data = synthetic_data_dir(tmp_path, n_train=40, n_valid=8)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("arch: small\nd_model: 32\nd-ff: 64\nheads: 2\nencoder-layers: 1\ndecoder-layers: 1\n"
                      "lr-schedule: linear\nlr: 0.001\nwarmup: 2\ndevice: cpu\nthreads: 1\nno-scale-embeddings: true\n")
    dumped = cli("train", data, "--save-dir", tmp_path / "ckpt", "--config", recipe, "--max-updates", 3, "--quiet",
                 "--dump-config")
    assert dumped.exit_code == 0, dumped.output
    values = yaml.safe_load(dumped.stdout)
    assert values["lr-scale"] == 1.0 and values["scale-embeddings"] is False and values["max-updates"] == 3
    assert values["data-dir"] == str(data) and values["d-model"] == 32 and not (tmp_path / "ckpt").exists()
    (tmp_path / "dumped.yaml").write_text(dumped.stdout)
    assert cli("train", "--config", tmp_path / "dumped.yaml", "--dump-config").stdout == dumped.stdout
    trained = cli("train", "--config", tmp_path / "dumped.yaml")
    assert trained.exit_code == 0, trained.output
    assert (tmp_path / "ckpt/checkpoint_last.pt").is_file()
    architecture = json.loads(cli("info", "-m", tmp_path / "ckpt/checkpoint_last.pt", "--json").stdout)["architecture"]
    assert "d_model 32" in architecture and "scale_embeddings False" in architecture
    tuning = cli("train", data, "--save-dir", tmp_path / "tuned", "--init-from", tmp_path / "ckpt/checkpoint_last.pt",
                 "--max-updates", 1, "--device", "cpu", "--quiet", "--dump-config")  # holds the default --arch base
    (tmp_path / "tuning.yaml").write_text(tuning.stdout)
    tuned = cli("train", "--config", tmp_path / "tuning.yaml")
    assert tuned.exit_code == 0 and (tmp_path / "tuned/checkpoint_last.pt").is_file(), tuned.output


def test_the_quickstart_recipe_is_a_config_file_of_nmt_train():
    recipe = ROOT / "data/quickstart.yaml"
    values = yaml.safe_load(recipe.read_text())
    assert values["arch"] == "small" and values["lr-schedule"] == "linear"
    assert f"--config {recipe.relative_to(ROOT)}" in (ROOT / "data/quickstart.sh").read_text()


def test_an_option_that_repeats_takes_a_list_or_one_value(tmp_path):
    """`model: [a.pt]` and `model: a.pt` are both `-m a.pt`; a list item of the wrong kind is one line."""
    model = tiny_checkpoint(tmp_path / "m.pt")
    lines = "a b c\n"
    by_flag = cli("translate", "-m", model, "--device", "cpu", input=lines)
    for value in (f"[{model}]", str(model)):
        (tmp_path / "c.yaml").write_text(f"model: {value}\ndevice: cpu\n")
        by_file = cli("translate", "--config", tmp_path / "c.yaml", input=lines)
        assert by_file.exit_code == 0 and by_file.stdout == by_flag.stdout, by_file.output
    (tmp_path / "c.yaml").write_text(f"model: [{model}, [x]]\n")
    result = cli("translate", "--config", tmp_path / "c.yaml")
    assert result.exit_code == 1 and result.output == f"Error: {tmp_path / 'c.yaml'}:1: model: a list, where the " \
                                                      "option takes one value\n"


def test_a_config_file_is_a_small_regular_file(tmp_path):
    """Not a device that never ends (/dev/zero, directly or through a link), nor data given by mistake."""
    (tmp_path / "zero.yaml").symlink_to("/dev/zero")
    (tmp_path / "big.yaml").write_text("# " + "x" * (2 << 20) + "\n")
    for path, message in (("/dev/zero", "/dev/zero: a character device, not a regular file"),
                          (tmp_path / "zero.yaml", "zero.yaml: a character device, not a regular file"),
                          (tmp_path / "big.yaml", "bytes; a config file of options is at most 1,048,576")):
        result = cli("translate", "--config", path)
        assert result.exit_code == 1 and message in result.output and len(result.output.splitlines()) == 1


def test_an_empty_config_file_sets_nothing_and_an_unreadable_one_is_one_line(tmp_path):
    (tmp_path / "empty.yaml").write_text("")
    dumped = cli("info", "--config", tmp_path / "empty.yaml", "--dump-config")
    assert dumped.exit_code == 0 and dumped.stdout == cli("info", "--dump-config").stdout
    assert "arch: base" in dumped.stdout
    (tmp_path / "latin1.yaml").write_bytes("beam: 4 # \xe9t\xe9\n".encode("latin-1"))
    result = cli("translate", "--config", tmp_path / "latin1.yaml")
    assert result.exit_code == 1 and result.output.startswith(f"Error: {tmp_path / 'latin1.yaml'}: not UTF-8 text (")


def test_the_configuration_dumps_without_the_required_arguments():
    dumped = cli("translate", "--dump-config")
    assert dumped.exit_code == 0 and "beam: 4" in dumped.stdout.splitlines() and "model:" not in dumped.stdout
    assert cli("translate").exit_code == 2  # still required to run
