"""The `nmt` command: parses options and calls the library. No logic of its own lives here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from nmt_cli.command import Group, changed_flags, given_flags
from nmt_cli.config import FROM_DATA_DECIDES, PreprocessConfig, SearchConfig, TextConfig, TrainConfig
from nmt_cli.corpus.report import filter_warnings, print_summary, print_table
from nmt_cli.flags import build, build_model_config, config_options, fields_of, model_options
from nmt_cli.interop.card import CardConfig
from nmt_cli.model.architecture import ModelConfig
from nmt_cli.options import flag_name
from nmt_cli.run_config import ExportConfig, ImportConfig, RunConfig, ServeConfig, TranslateConfig
from nmt_cli.version import __version__


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
@click.option("-m", "--model", type=click.Path(exists=True, path_type=Path),
              help="Describe this checkpoint instead: its architecture, vocabularies, language codes, search.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def info(arch: str, vocab_size: int, tgt_vocab_size: int | None, model: Path | None, as_json: bool,
         **overrides: Any) -> None:
    """Show an architecture, or a checkpoint (-m).

    With Table 3's count when the architecture is a row of the paper."""
    if model is not None:
        given = sorted(changed_flags() - {"model", "as_json"})
        if given:
            raise click.UsageError(f"--{given[0].replace('_', '-')} describes an architecture; -m describes the "
                                   "checkpoint's own")
        from nmt_cli.model.checkpoint import load_bundle

        about = load_bundle(model).summary()
        if as_json:
            click.echo(json.dumps(about, ensure_ascii=False))
            return
        print_table(f"nmt-cli checkpoint {model.name}", [(key, ", ".join(map(str, value)) or "none"
                                                          if isinstance(value, list) else str(value))
                                                         for key, value in about.items()])
        return
    config = build_model_config(arch, overrides)
    shared = tgt_vocab_size is None
    params = config.num_parameters(vocab_size, tgt_vocab_size or vocab_size, shared)
    from nmt_cli.model.architecture import paper_row

    row = paper_row(config)
    result = {
        "arch": arch, "config": config.to_dict(), "src_vocab_size": vocab_size,
        "tgt_vocab_size": tgt_vocab_size or vocab_size, "shared_vocab": shared, "parameters": params,
        "paper_row": row.name if row else None, "paper_parameters_m": row.params_m if row else None,
    }
    if as_json:
        click.echo(json.dumps(result))
        return
    vocabulary = f"{vocab_size} shared (3-way tying)" if shared else \
        f"{vocab_size} source / {tgt_vocab_size} target (2-way tying)"
    print_table(f"nmt-cli architecture ({arch})", [
        *((key, str(value)) for key, value in config.to_dict().items()), ("vocabulary", vocabulary),
        ("parameters", f"{params:,} ({params / 1e6:.1f}M)"), *([("paper (Table 3)", f"{row.name}: {row.params_m:g}M")]
                                                              if row else [])])


@main.command()
@config_options(TextConfig)
@config_options(PreprocessConfig)
@click.option("--from-data", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Reuse tokenizer settings, BPE codes and vocabularies of this data directory.")
@click.option("--from-model", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Prepare the text as this checkpoint's model reads it (its tokenizer settings, subword models "
                   "and vocabularies): data to fine-tune it on with `nmt train --init-from`.")
@click.option("--quiet", is_flag=True, help="No progress bars or summary.")
def preprocess(from_data: Path | None, from_model: Path | None, quiet: bool, **options: Any) -> None:
    """Tokenize, learn BPE and binarize parallel text.

    Raw parallel text to a data directory: Moses tokenization and joint BPE (or SentencePiece),
    vocabularies, and token ids as memory-mapped arrays."""
    import tempfile

    from nmt_cli.corpus.datadir import DataDir
    from nmt_cli.corpus.from_model import model_pipeline
    from nmt_cli.corpus.preprocess import preprocess

    text = build(TextConfig, **fields_of(TextConfig, options))
    if from_data is not None and from_model is not None:
        raise click.UsageError("give --from-data or --from-model, not both")
    reusing = "--from-data" if from_data is not None else "--from-model" if from_model is not None else None
    if reusing:
        fields = {**PreprocessConfig.__dataclass_fields__, **TextConfig.__dataclass_fields__}
        decided = [name for name in sorted(changed_flags()) if name in FROM_DATA_DECIDES
                   or name in TextConfig.__dataclass_fields__ and name not in ("source_lang", "target_lang")]
        if decided:
            raise click.UsageError(f"{flag_name(fields[decided[0]])} applies only without {reusing} (the "
                                   f"{'data directory' if from_data else 'model'} decides the text settings, "
                                   "subwords and vocabularies)")
    with tempfile.TemporaryDirectory(prefix="nmt-from-model-") as files:
        if from_data is not None:
            text, reused = DataDir.open(from_data, verify=True).reuse(text.source_lang, text.target_lang)
            options.update(reused)
        elif from_model is not None:
            text, reused = model_pipeline(from_model, Path(files), text.source_lang, text.target_lang,
                                          warn=lambda message: click.echo(message, err=True),
                                          sample=options.get("trainpref"))
            options.update(reused)
        data = preprocess(build(PreprocessConfig, text=text, progress=not quiet, **options))
    if not quiet:
        print_summary(data)
    for line in filter_warnings(data):
        click.echo(line, err=True)


@main.command()
@click.argument("data_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--save-dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Checkpoints and train_log.jsonl; training resumes from its checkpoint_last.pt.")
@model_options
@config_options(TrainConfig)
@click.option("--reset", is_flag=True, help="Start afresh even if --save-dir has a checkpoint.")
@click.option("--init-from", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Fine-tune: start from this checkpoint's weights and architecture (new optimizer and counters; "
                   "prepare the data with `nmt preprocess --from-model`).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def train(data_dir: Path, save_dir: Path, arch: str, reset: bool, init_from: Path | None, quiet: bool,
          **options: Any) -> None:
    """Train a Transformer with the paper's regime.

    Resumable (run the same command again); torchrun for many GPUs and machines (docs/distributed.md)."""
    from nmt_cli.train.run import TrainingRun, fine_tuning_config

    if init_from is None:
        model_config = build_model_config(arch, options)
    else:
        model_flags = fields_of(ModelConfig, options)
        given = sorted(changed_flags() & {"arch", *model_flags})  # a dumped file holds --arch base
        model_config = fine_tuning_config(init_from, {name: model_flags.get(name) for name in given})
    config = build(TrainConfig, **options)
    TrainingRun(data_dir, save_dir, model_config, config, reset, init_from, progress_bar=not quiet).run()


@main.command("average-checkpoints")
@click.argument("checkpoints", nargs=-1, type=click.Path(path_type=Path))
@click.option("--inputs", is_flag=True, help="The checkpoints to average follow: --inputs A.pt B.pt ... (fairseq's "
              "form; --inputs A.pt --inputs B.pt and plain A.pt B.pt work too).")
@click.option("--dir", "save_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Average the newest numbered checkpoints of this save directory.")
@click.option("--last", type=click.IntRange(min=1), default=5, show_default=True,
              help="How many, with --dir (the paper: 5 for base, 20 for big).")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path), help="Output file.")
def average_checkpoints(checkpoints: tuple[Path, ...], inputs: bool, save_dir: Path | None, last: int,
                        output: Path) -> None:
    """Average the parameters of checkpoints (§6.1)."""
    from nmt_cli.model.averaging import average
    from nmt_cli.model.checkpoint import save
    from nmt_cli.train.savedir import last_checkpoints

    if bool(checkpoints) == bool(save_dir):
        raise click.UsageError("give either --inputs A.pt B.pt ... or --dir SAVE_DIR [--last N]")
    from nmt_cli.files import destination

    paths = list(checkpoints) if checkpoints else last_checkpoints(save_dir, last)
    out = destination(output, "checkpoint", inputs=paths)
    save(average(paths), out)
    click.echo(f"averaged {len(paths)} checkpoints into {output}: {', '.join(p.name for p in paths)}", err=True)


def model_defaults(params: dict[str, Any]) -> dict[str, Any]:
    from nmt_cli.decode.translate import model_defaults as defaults  # torch: only for --dump-config

    return defaults(params.get("models") or ())


@main.command(inputs_decide=model_defaults)
@click.option("-m", "--model", "models", multiple=True, required=True,
              type=click.Path(exists=True, path_type=Path),
              help="Checkpoint; repeat for an ensemble (probabilities averaged each step).")
@click.option("-i", "--input", "input_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Input file, one sentence per line [default: stdin].")
@click.option("-o", "--output", "output_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Output file, written when complete [default: stdout].")
@click.option("--shortlist", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A lexical shortlist of `nmt shortlist`: each batch outputs only its sources' candidates and the "
                   "frequent target tokens (faster on a CPU).")
@config_options(SearchConfig)
@config_options(RunConfig)
@config_options(TranslateConfig)
def translate(models: tuple[Path, ...], input_path: Path | None, output_path: Path | None, shortlist: Path | None,
              **options: Any) -> None:
    """Translate raw text with batched beam search.

    Beam search with the length penalty of §6.1 (or sampling); raw text in, detokenized text out."""
    import atexit
    import gc

    from nmt_cli.decode.translate import translate_file

    # The interpreter's last garbage collection, at exit, would walk every object torch made, for
    # nothing: tenths of a second of a short translation. Frozen objects are left out of it.
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)

    search = build(SearchConfig, **fields_of(SearchConfig, options))
    config = build(TranslateConfig, run=build(RunConfig, search=search, **fields_of(RunConfig, options)), **options)
    penalty = {"lenpen", "lenpen_form", "lenpen_start"}
    searching = sorted(changed_flags() & set(SearchConfig.__dataclass_fields__) - penalty)
    if config.score_reference and searching:
        raise click.UsageError(f"{flag_name(SearchConfig.__dataclass_fields__[searching[0]])} applies only to "
                               "translation, not with --score-reference (--lenpen, --lenpen-form and --lenpen-start "
                               "set its scores' penalty)")
    if config.attention_plot is not None:
        from nmt_cli.plot import plot_directory, pyplot

        pyplot()  # fail before translating anything when matplotlib is missing
        plot_directory(config.attention_plot)
    translate_file(list(models), input_path, output_path, config,
                   given_flags() & set(SearchConfig.__dataclass_fields__), shortlist)


@main.command("shortlist")
@click.argument("data_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The shortlist file to write.")
@click.option("--first", type=click.IntRange(min=0), default=100, show_default=True,
              help="The most frequent target tokens, always candidates.")
@click.option("--best", type=click.IntRange(min=0), default=50, show_default=True,
              help="Candidates per source token: the targets most likely aligned to it (IBM model 1).")
def shortlist(data_dir: Path, output: Path, first: int, best: int) -> None:
    """Learn a lexical shortlist from training data.

    For `nmt translate --shortlist` (the API, the server, CTranslate2): faster CPU decoding."""
    from nmt_cli.decode.shortlist import make
    from nmt_cli.files import destination

    if first == best == 0:
        raise click.UsageError("--first 0 --best 0 would shortlist no token; give either")
    out = destination(output, "shortlist", inputs=[data_dir])
    make(data_dir, first, best).save(out)
    click.echo(f"shortlist of {data_dir} to {output}: the {first} most frequent target tokens and {best} per "
               f"source token", err=True)


@main.command("import")
@click.argument("source", type=click.Path(path_type=Path))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The checkpoint to write (.pt).")
@config_options(ImportConfig)
def import_model(source: Path, output: Path, **options: Any) -> None:
    """Import Marian, fairseq, OpenNMT-py, Argos models.

    SOURCE: a MarianMTModel directory (OPUS-MT), Marian's own release (model.npz, decoder.yml,
    vocabularies, .spm files), a fairseq or OpenNMT-py checkpoint file, a CTranslate2 model directory
    (model.bin), or an Argos Translate package (.argosmodel, or an installed package's folder), read
    without running code from it: a checkpoint like one trained here, with its toolkit's decoding
    settings as defaults."""
    from nmt_cli.files import destination
    from nmt_cli.interop.importer import import_model

    config = build(ImportConfig, **options)
    inputs = [source, *filter(None, [config.bpe_codes, config.sentencepiece])]  # and the files read: import_model
    checkpoint = import_model(source, destination(output, "checkpoint", inputs=inputs),
                              warn=lambda message: click.echo(message, err=True), options=config)
    from nmt_cli.model.checkpoint import bundle_of

    about = bundle_of(checkpoint, output).summary()  # the weights written, not read back
    click.echo(f"imported {source} into {output}: {about['parameters']:,} parameters, {about['layers']} layers, "
               f"vocabulary {about['vocabulary']}", err=True)


@main.command()
@click.option("-m", "--model", required=True, type=click.Path(exists=True, path_type=Path),
              help="Checkpoint to export.")
@config_options(ExportConfig)
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path),
              help="Directory (ctranslate2, transformers, onnx, web), .argosmodel file (argos) or .safetensors file.")
@config_options(CardConfig)
@click.option("--eval", "evaluations", nargs=2, multiple=True, metavar="SRC REF",
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="transformers: translate SRC and score it against REF (sacreBLEU's BLEU and chrF) for the model "
                   "card (repeatable).")
def export(model: Path, output: Path, evaluations: tuple[tuple[Path, Path], ...], **options: Any) -> None:
    """Export to CTranslate2, Argos, ONNX, HF or a page.

    With its text pipeline: BPE codes or SentencePiece model, and how to use them (or one safetensors
    file)."""
    from nmt_cli.files import destination
    from nmt_cli.interop.exporter import export_model
    from nmt_cli.interop.formats import WRITERS

    config = build(ExportConfig, **fields_of(ExportConfig, options))
    card = fields_of(CardConfig, options)
    if config.format != "transformers" and (given := sorted(changed_flags() & {"evaluations", *card})):
        flag = "--eval" if given[0] == "evaluations" else flag_name(CardConfig.__dataclass_fields__[given[0]])
        raise click.UsageError(f"{flag} applies only to --format transformers")
    output = destination(output, "export", inputs=[model, *filter(None, [config.shortlist, config.sentences]),
                                                   *sum(evaluations, ())])
    suffix = WRITERS[config.format].suffix
    if suffix is not None and output.suffix != suffix:
        raise click.UsageError(f"{output}: {WRITERS[config.format].summary} ends in {suffix}")
    if (note := export_model(model, output, config, build(CardConfig, **card), evaluations)) is not None:
        click.echo(note, err=True)
    click.echo(f"exported {model} to {output} ({config.format})", err=True)


@main.command()
@click.option("-m", "--model", "models", multiple=True, required=True, metavar="[SRC-TGT=]CHECKPOINT",
              help="Checkpoint, served for the languages it was trained on, or for SRC-TGT; repeat for several "
                   "pairs (one pair again: an ensemble).")
@config_options(ServeConfig)
def serve(models: tuple[str, ...], **options: Any) -> None:
    """Serve translations over HTTP (the serve extra).

    nmt-cli's API and LibreTranslate's, a page at /; requests that arrive together share a search."""
    from nmt_cli.serve.app import serve as run_server

    run_server(list(models), build(ServeConfig, **options))


@main.group()
def plot() -> None:
    """Pictures: training curves.

    Attention maps: `nmt translate --attention-plot DIR`."""


@plot.command(page="plot")
@click.argument("save_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=Path("curves.png"),
              show_default=True, help="PNG file.")
def curves(save_dirs: tuple[Path, ...], output: Path) -> None:
    """Loss, perplexity and BLEU of training runs, overlaid.

    One or more `nmt train` save directories."""
    from nmt_cli.plot import training_curves

    click.echo(f"wrote {training_curves(list(save_dirs), output)}", err=True)


# sacreBLEU's tokenizers that need nothing downloaded (flores101/200 and spm fetch a model)
SACREBLEU_TOKENIZERS = ("13a", "intl", "zh", "char", "none", "ja-mecab", "ko-mecab")


@main.command()
@click.option("-r", "--ref", "refs", multiple=True, required=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path), help="Reference file (repeatable).")
@click.option("-i", "--hyp", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Detokenized hypotheses [default: stdin].")
@click.option("-m", "--metrics", multiple=True, type=click.Choice(["bleu", "chrf", "ter"]), default=["bleu"],
              show_default=True, help="Metrics (repeatable).")
@click.option("--tokenize", default=None, type=click.Choice(SACREBLEU_TOKENIZERS),
              help="sacreBLEU's tokenizer [default: 13a] (ja-mecab and ko-mecab need sacrebleu[ja] or [ko]).")
@click.option("--lowercase", is_flag=True, help="Case-insensitive scores.")
@click.option("--paper-bleu", "paper_lang", metavar="LANG", default=None,
              help="Also the paper's tokenized, compound-split BLEU (Moses tokenizer for LANG, e.g. de).")
@click.option("--sentence", is_flag=True, help="Each line's scores instead, one line each, tab-separated in the "
              "order of -m (sacreBLEU's sentence level: BLEU with effective order).")
@click.option("--compare", nargs=2, type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              metavar="A B", help="Compare two hypothesis files by sacreBLEU's paired bootstrap resampling (1,000 "
                                  "resamples): each one's score, mean and 95% confidence interval, and B's p-value "
                                  "against A.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per metric (per line with --sentence).")
def score(refs: tuple[Path, ...], hyp: Path | None, metrics: tuple[str, ...], tokenize: str | None, lowercase: bool,
          paper_lang: str | None, sentence: bool, compare: tuple[Path, Path] | None, as_json: bool) -> None:
    """Corpus BLEU, chrF and TER with sacreBLEU's signature.

    Or each line's scores (--sentence), or two systems compared (--compare A B)."""
    from nmt_cli.score import Scoring, scored_lines

    if sentence and paper_lang:
        raise click.UsageError("--sentence and --paper-bleu do not go together")
    if compare and (other := next((flag for flag, on in (("-i", hyp), ("--paper-bleu", paper_lang),
                                                          ("--sentence", sentence)) if on), None)):
        raise click.UsageError(f"{other} and --compare do not go together")
    scoring = Scoring(metrics, tokenize, lowercase, paper_lang, sentence, as_json)
    lines = scored_lines(list(refs), list(compare or [hyp]), scoring, lambda message: click.echo(message, err=True))
    click.echo("\n".join(lines))
