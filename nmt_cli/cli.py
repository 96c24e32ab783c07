"""The `nmt` command: parses options and calls the library. No logic of its own lives here."""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from collections.abc import Callable
from typing import Any

import click

from nmt_cli import __version__
from nmt_cli.config import PRESETS, ModelConfig, paper_row


def _click_type(f: dataclasses.Field) -> click.ParamType:
    meta = f.metadata
    if "choices" in meta:
        return click.Choice(meta["choices"])
    hint = typing.get_type_hints(ModelConfig)[f.name]
    if isinstance(hint, types.UnionType):  # `int | None`
        hint = next(t for t in typing.get_args(hint) if t is not type(None))
    if hint is int:
        return click.IntRange(min=meta.get("min"))
    return click.FloatRange(min=meta.get("min"), max=meta.get("max"), max_open="max" in meta)


def model_options(command: Callable) -> Callable:
    """`--arch` plus one flag per ModelConfig field (`d_ff` -> `--d-ff`), all defaulting to the preset."""
    for f in reversed(dataclasses.fields(ModelConfig)):
        flag = "--" + f.name.replace("_", "-")
        command = click.option(flag, f.name, type=_click_type(f), default=None,
                               help=f.metadata["help"])(command)
    return click.option("--arch", type=click.Choice(sorted(PRESETS)), default="base", show_default=True,
                        help="Preset: base/big (Table 3), iwslt, small (CPU).")(command)


def build_model_config(arch: str, overrides: dict[str, Any]) -> ModelConfig:
    """The preset `arch` with the command-line overrides; a bad combination is a usage error."""
    try:
        return PRESETS[arch].replace(**{f.name: overrides.pop(f.name) for f in dataclasses.fields(ModelConfig)})
    except ValueError as e:
        raise click.UsageError(str(e)) from None


def not_yet(name: str) -> Callable:
    """A subcommand whose issue is not built yet: says so and exits non-zero."""

    @functools.wraps(lambda: None)
    def command() -> None:
        raise click.ClickException(f"`nmt {name}` is not available yet in nmt-cli {__version__}.")

    return command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="nmt-cli")
def main() -> None:
    """nmt: the Transformer of "Attention Is All You Need" for translation and any seq2seq task."""


@main.command()
@model_options
@click.option("--vocab-size", type=click.IntRange(min=1), default=37000, show_default=True,
              help="Vocabulary size (joint unless --tgt-vocab-size is given).")
@click.option("--tgt-vocab-size", type=click.IntRange(min=1), default=None,
              help="Target vocabulary size for separate vocabularies (2-way tying).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def info(arch: str, vocab_size: int, tgt_vocab_size: int | None, as_json: bool, **overrides: Any) -> None:
    """Show an architecture and its parameter count (with Table 3's count when it is a paper row)."""
    config = build_model_config(arch, overrides)
    shared = tgt_vocab_size is None
    params = config.num_parameters(vocab_size, tgt_vocab_size or vocab_size, shared)
    row = paper_row(config)
    result = {
        "arch": arch, "config": config.to_dict(), "src_vocab_size": vocab_size,
        "tgt_vocab_size": tgt_vocab_size or vocab_size, "shared_vocab": shared, "parameters": params,
        "paper_row": row.name if row else None, "paper_parameters_m": row.params_m if row else None,
    }
    if as_json:
        click.echo(json.dumps(result))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"nmt-cli architecture ({arch})", show_header=False)
    for key, value in config.to_dict().items():
        table.add_row(key, str(value))
    table.add_row("vocabulary", f"{vocab_size} shared (3-way tying)" if shared
                  else f"{vocab_size} source / {tgt_vocab_size} target (2-way tying)")
    table.add_row("parameters", f"{params:,} ({params / 1e6:.1f}M)")
    if row:
        table.add_row("paper (Table 3)", f"{row.name}: {row.params_m:g}M")
    Console().print(table)


for _name, _help in [
    ("preprocess", "Tokenize, learn/apply joint BPE, build vocabularies and binarize parallel text."),
    ("train", "Train a Transformer with the paper's regime (resumable; torchrun for many GPUs)."),
    ("average-checkpoints", "Average the parameters of the last N checkpoints (§6.1)."),
    ("translate", "Translate raw text with batched beam search and length penalty."),
    ("score", "Corpus BLEU (and chrF/TER) through sacreBLEU, with its signature."),
]:
    main.command(_name, help=_help + " [not available yet]", short_help=_help)(not_yet(_name))
