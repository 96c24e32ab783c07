"""The `nmt` command: parses options and calls the library. No logic of its own lives here."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from nmt_cli import NmtError, __version__
from nmt_cli.config import PRESETS, ModelConfig, TrainConfig, paper_row


def _click_type(cls: type, f: dataclasses.Field) -> click.ParamType:
    meta = f.metadata
    if "choices" in meta:
        return click.Choice(meta["choices"])
    hint = typing.get_type_hints(cls)[f.name]
    if isinstance(hint, types.UnionType):  # `int | None`
        hint = next(t for t in typing.get_args(hint) if t is not type(None))
    if hint is int:
        return click.IntRange(min=meta.get("min"))
    return click.FloatRange(min=meta.get("min"), max=meta.get("max"), min_open=meta.get("exclusive_min", False),
                            max_open="max" in meta)


def config_options(cls: type, show_defaults: bool = True) -> Callable[[Callable], Callable]:
    """One flag per field of a config dataclass (`d_ff` -> `--d-ff`). Without `show_defaults` every
    flag defaults to None, meaning "keep the preset's value"."""

    def decorate(command: Callable) -> Callable:
        for f in reversed(dataclasses.fields(cls)):
            flag = "--" + f.name.replace("_", "-")
            if f.type in (bool, "bool"):
                command = click.option(flag, f.name, is_flag=True, default=None, help=f.metadata["help"])(command)
                continue
            default = f.default if show_defaults else None
            command = click.option(flag, f.name, type=_click_type(cls, f), default=default,
                                   show_default=default is not None, help=f.metadata["help"])(command)
        return command

    return decorate


def model_options(command: Callable) -> Callable:
    """`--arch` plus every ModelConfig field as a flag, defaulting to the preset's value."""
    command = config_options(ModelConfig, show_defaults=False)(command)
    return click.option("--arch", type=click.Choice(sorted(PRESETS)), default="base", show_default=True,
                        help="Preset: base/big (Table 3), iwslt, small (CPU).")(command)


def build_model_config(arch: str, overrides: dict[str, Any]) -> ModelConfig:
    """The preset `arch` with the command-line overrides; a bad combination is a usage error."""
    try:
        return PRESETS[arch].replace(**{f.name: overrides.pop(f.name) for f in dataclasses.fields(ModelConfig)})
    except ValueError as e:
        raise click.UsageError(str(e)) from None


class Group(click.Group):
    """Turns the library's user errors into one-line click errors (exit code 1, no traceback)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except NmtError as e:
            raise click.ClickException(str(e)) from None


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="nmt-cli")
def main() -> None:
    """nmt: the Transformer of "Attention Is All You Need" for translation and any seq2seq task."""
    from nmt_cli.files import handle_sigterm

    handle_sigterm()  # SIGTERM ends a command like Ctrl-C: its temporaries are removed on the way out


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


@main.command()
@click.option("-s", "--source-lang", required=True, help="Source suffix: PREFIX.SRC (or PREFIX.SRC.gz).")
@click.option("-t", "--target-lang", required=True, help="Target suffix.")
@click.option("--trainpref", help="Training files prefix (learns BPE and vocabulary; filtered).")
@click.option("--validpref", help="Validation files prefix (never filtered).")
@click.option("--testpref", "testprefs", multiple=True, help="Test files prefix (repeatable; never filtered).")
@click.option("--destdir", required=True, type=click.Path(path_type=Path), help="Output data directory.")
@click.option("--from-data", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Reuse tokenizer settings, BPE codes and vocabularies of this data directory.")
@click.option("--tokenizer", type=click.Choice(["moses", "none"]), default="moses", show_default=True,
              help="Moses (sacremoses) or plain whitespace splitting.")
@click.option("--normalize-punctuation/--no-normalize-punctuation", default=True, show_default=True,
              help="Moses punctuation normalization before tokenizing.")
@click.option("--lowercase", is_flag=True, help="Lowercase after tokenizing.")
@click.option("--aggressive-dash-splits", is_flag=True, help="Split hyphens (Moses -a): fore@-@runner.")
@click.option("--bpe-merges", type=click.IntRange(min=0), default=32000, show_default=True,
              help="Joint BPE merge operations to learn (0: no BPE).")
@click.option("--bpe-codes", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Apply these BPE codes instead of learning them.")
@click.option("--joined-dictionary/--separate-dictionaries", default=True, show_default=True,
              help="One vocabulary for both sides (3-way tying) or one per side.")
@click.option("--srcdict", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Use this source (or joint) vocabulary.")
@click.option("--tgtdict", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Use this target vocabulary.")
@click.option("--vocab-min-count", type=click.IntRange(min=1), default=1, show_default=True,
              help="Leave out subwords seen fewer times in training.")
@click.option("--vocab-size", type=click.IntRange(min=5), default=None, help="At most this many entries.")
@click.option("--padding-factor", type=click.IntRange(min=1), default=8, show_default=True,
              help="Pad built vocabularies with unused entries to a multiple of this (fast matrix shapes).")
@click.option("--max-len", type=click.IntRange(min=1), default=250, show_default=True,
              help="Drop training pairs with a side longer than this many BPE tokens.")
@click.option("--max-len-ratio", type=click.FloatRange(min=1.0), default=1.5, show_default=True,
              help="Drop training pairs whose word counts differ by more than this ratio (Moses clean-corpus).")
@click.option("--workers", type=click.IntRange(min=1), default=len(os.sched_getaffinity(0)), show_default=True,
              help="Processes for tokenization, BPE and binarization.")
@click.option("--force", is_flag=True, help="Replace a non-empty --destdir.")
@click.option("--quiet", is_flag=True, help="No progress bars or summary.")
def preprocess(source_lang: str, target_lang: str, from_data: Path | None, tokenizer: str,
               normalize_punctuation: bool, lowercase: bool, aggressive_dash_splits: bool, quiet: bool,
               **options: Any) -> None:
    """Tokenize, learn/apply joint BPE, build vocabularies and binarize parallel text."""
    from nmt_cli.preprocess import PreprocessOptions, preprocess, reuse_options
    from nmt_cli.text import TextConfig

    text = TextConfig(source_lang, target_lang, tokenizer, normalize_punctuation, lowercase, aggressive_dash_splits)
    if from_data is not None:
        text, reused = reuse_options(from_data, source_lang, target_lang)
        options.update(reused)
    options["testprefs"] = tuple(options["testprefs"])
    meta = preprocess(PreprocessOptions(text=text, progress=not quiet, **options))
    if not quiet:
        print_preprocess_summary(meta)


def print_preprocess_summary(meta: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    src, tgt = meta["text"]["source_lang"], meta["text"]["target_lang"]
    table = Table(title=f"nmt preprocess {src}-{tgt}: vocabulary {meta['vocab_sizes'][src]:,}"
                        f" / {meta['vocab_sizes'][tgt]:,}")
    for column in ("split", "pairs in", "pairs out", "dropped", "tokens", "unk", "s"):
        table.add_column(column, justify="right")
    for name, s in meta["splits"].items():
        dropped = ", ".join(f"{k} {v:,}" for k, v in s["dropped"].items()) or "-"
        tokens = f"{s['tokens'].get(src, 0):,} / {s['tokens'].get(tgt, 0):,}"
        unk = f"{s['unk_rate'][src]:.2%} / {s['unk_rate'][tgt]:.2%}"
        table.add_row(name, f"{s['pairs_in']:,}", f"{s['pairs_out']:,}", dropped, tokens, unk, f"{s['seconds']:.1f}")
    console = Console(stderr=True)
    console.print(table)
    console.print("stage seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in meta["timings"].items()))


@main.command()
@click.argument("data_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--save-dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Checkpoints and train_log.jsonl; training resumes from its checkpoint_last.pt.")
@model_options
@config_options(TrainConfig)
@click.option("--reset", is_flag=True, help="Start afresh even if --save-dir has a checkpoint.")
@click.option("--init-from", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Fine-tune: start from this checkpoint's weights (new optimizer and counters).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def train(data_dir: Path, save_dir: Path, arch: str, reset: bool, init_from: Path | None, quiet: bool,
          **options: Any) -> None:
    """Train a Transformer with the paper's regime (resumable; torchrun for many GPUs)."""
    from nmt_cli.train import TrainingRun

    model_config = build_model_config(arch, options)
    try:
        config = TrainConfig(**{k: v for k, v in options.items() if v is not None})
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    TrainingRun(data_dir, save_dir, model_config, config, reset, init_from, progress_bar=not quiet).run()


@main.command("average-checkpoints")
@click.option("--inputs", multiple=True, type=click.Path(path_type=Path), help="Checkpoints to average (repeatable).")
@click.option("--dir", "save_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Average the newest numbered checkpoints of this save directory.")
@click.option("--last", type=click.IntRange(min=1), default=5, show_default=True,
              help="How many, with --dir (the paper: 5 for base, 20 for big).")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path), help="Output file.")
def average_checkpoints(inputs: tuple[Path, ...], save_dir: Path | None, last: int, output: Path) -> None:
    """Average the parameters of the last N checkpoints (§6.1)."""
    from nmt_cli.checkpoint import average, last_checkpoints, save

    if bool(inputs) == bool(save_dir):
        raise click.UsageError("give either --inputs A.pt B.pt ... or --dir SAVE_DIR [--last N]")
    paths = list(inputs) if inputs else last_checkpoints(save_dir, last)
    save(average(paths), output)
    click.echo(f"averaged {len(paths)} checkpoints into {output}: {', '.join(p.name for p in paths)}", err=True)


@main.command()
@click.option("-m", "--model", "models", multiple=True, required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Checkpoint; repeat for an ensemble (probabilities averaged each step).")
@click.option("-i", "--input", "input_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Input file, one sentence per line [default: stdin].")
@click.option("-o", "--output", "output_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Output file, written when complete [default: stdout].")
@click.option("--beam", type=click.IntRange(min=1), default=4, show_default=True, help="Beam size (1: greedy).")
@click.option("--lenpen", type=click.FloatRange(min=0.0), default=0.6, show_default=True,
              help="Length penalty alpha: score / ((5 + |Y|) / 6)^alpha.")
@click.option("--max-len-a", type=click.FloatRange(min=0.0), default=1.0, show_default=True,
              help="Max output length = a * input length + b.")
@click.option("--max-len-b", type=click.IntRange(min=0), default=50, show_default=True, help="See --max-len-a.")
@click.option("--nbest", type=click.IntRange(min=1), default=1, show_default=True,
              help="Hypotheses per sentence (in --format jsonl).")
@click.option("--allow-unk", is_flag=True, help="Let the search emit <unk>.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=8000, show_default=True,
              help="Source tokens per batch.")
@click.option("--batch-size", type=click.IntRange(min=1), default=None, help="Sentences per batch at most.")
@click.option("--input-format", type=click.Choice(["raw", "bpe"]), default="raw", show_default=True,
              help="raw: tokenize and apply BPE; bpe: the input is already BPE tokens.")
@click.option("--output-format", type=click.Choice(["text", "tokens", "bpe"]), default="text", show_default=True,
              help="text: detokenized; tokens: BPE removed; bpe: as produced.")
@click.option("--format", "fmt", type=click.Choice(["text", "jsonl"]), default="text", show_default=True,
              help="jsonl: one JSON object per line with scores and n-best.")
@click.option("--attention", is_flag=True,
              help="With --format jsonl: add the encoder-decoder attention (heads averaged) for alignment.")
@click.option("--attention-layer", type=click.IntRange(min=1), default=None,
              help="Decoder layer for --attention [default: the last].")
@click.option("--attention-plot", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write PNG heat maps of every attention per sentence here (needs matplotlib).")
@click.option("--layers", type=click.IntRange(min=1), multiple=True, help="Layers to plot (repeatable) [all].")
@click.option("--heads", type=click.IntRange(min=1), multiple=True, help="Heads to plot (repeatable) [all].")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--precision", type=click.Choice(["fp32", "bf16", "fp16"]), default="fp32", show_default=True)
@click.option("--quantize", type=click.Choice(["int8"]), default=None,
              help="CPU: run the linear layers as dynamic int8 matmuls (see the README for speed and BLEU).")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads for PyTorch.")
def translate(models: tuple[Path, ...], input_path: Path | None, output_path: Path | None, beam: int, lenpen: float,
              max_len_a: float, max_len_b: int, nbest: int, allow_unk: bool, max_tokens: int, batch_size: int | None,
              input_format: str, output_format: str, fmt: str, attention: bool, attention_layer: int | None,
              attention_plot: Path | None, layers: tuple[int, ...], heads: tuple[int, ...], device: str,
              precision: str, quantize: str | None, threads: int | None) -> None:
    """Translate raw text with batched beam search and length penalty."""
    from nmt_cli.search import SearchConfig
    from nmt_cli.translate import TranslateOptions, translate_file

    if nbest > beam:
        raise click.BadParameter(f"--nbest {nbest} is larger than --beam {beam}", param_hint="--nbest")
    if attention_plot is not None:
        from nmt_cli.plot import pyplot

        pyplot()  # fail before translating anything when matplotlib is missing
    search = SearchConfig(beam, lenpen, max_len_a, max_len_b, nbest, allow_unk)
    options = TranslateOptions(search, max_tokens, batch_size, input_format, output_format, fmt, attention,
                               attention_layer or -1, attention_plot, layers, heads, quantize)
    translate_file(list(models), input_path, output_path, options, device, precision, threads)


@main.group()
def plot() -> None:
    """Pictures: training curves (attention maps: `nmt translate --attention-plot DIR`)."""


@plot.command()
@click.argument("save_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=Path("curves.png"),
              show_default=True, help="PNG file.")
def curves(save_dirs: tuple[Path, ...], output: Path) -> None:
    """Loss, perplexity (and BLEU) of one or more `nmt train` save directories, overlaid."""
    from nmt_cli.plot import training_curves

    click.echo(f"wrote {training_curves(list(save_dirs), output)}", err=True)


@main.command()
@click.option("-r", "--ref", "refs", multiple=True, required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path), help="Reference file (repeatable).")
@click.option("-i", "--hyp", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Detokenized hypotheses [default: stdin].")
@click.option("-m", "--metrics", multiple=True, type=click.Choice(["bleu", "chrf", "ter"]), default=["bleu"],
              show_default=True, help="Metrics (repeatable).")
@click.option("--tokenize", default=None, help="sacreBLEU tokenizer: 13a (default), intl, zh, ja-mecab, none, ...")
@click.option("--lowercase", is_flag=True, help="Case-insensitive scores.")
@click.option("--paper-bleu", "paper_lang", metavar="LANG", default=None,
              help="Also the paper's tokenized, compound-split BLEU (Moses tokenizer for LANG, e.g. de).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per metric.")
def score(refs: tuple[Path, ...], hyp: Path | None, metrics: tuple[str, ...], tokenize: str | None, lowercase: bool,
          paper_lang: str | None, as_json: bool) -> None:
    """Corpus BLEU (and chrF/TER) through sacreBLEU, with its signature."""
    from nmt_cli.score import check_lengths, corpus_scores, paper_bleu
    from nmt_cli.text import decode_lines

    hyp_name = str(hyp) if hyp else "<stdin>"
    with open(hyp, "rb") if hyp else sys.stdin.buffer as stream:
        hypotheses = list(decode_lines(stream, hyp_name))
    references = []
    for ref in refs:
        with open(ref, "rb") as stream:
            references.append(list(decode_lines(stream, str(ref))))
    check_lengths(hypotheses, hyp_name, references, [str(r) for r in refs])
    results = corpus_scores(hypotheses, references, metrics, tokenize, lowercase)
    if paper_lang:
        results.append(paper_bleu(hypotheses, references, paper_lang))
    for result in results:
        click.echo(json.dumps(result.to_dict()) if as_json else result.text)
