"""The model card (README.md) of a transformers export, as the Hugging Face Hub validates it and
its users look for it: what the model is, what it was trained on and how well (the `model-index`:
the validation BLEU of training, and with `nmt export --eval SRC REF` a test set's), its licence,
intended use and limitations, how to run it and how to cite it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nmt_cli.options import Options, knob

if TYPE_CHECKING:
    from nmt_cli.model.checkpoint import ModelBundle
    from nmt_cli.score import Score

_OTHER = (lambda c: c.license == "other", "with --license other")
CITATION = """@inproceedings{vaswani2017attention,
  title = {Attention Is All You Need},
  author = {Vaswani, Ashish and Shazeer, Noam and Parmar, Niki and Uszkoreit, Jakob and Jones, Llion and
            Gomez, Aidan N. and Kaiser, {\\L}ukasz and Polosukhin, Illia},
  booktitle = {Advances in Neural Information Processing Systems 30},
  year = {2017}
}"""
UNSET_LICENCE = ("The licence of this model has not been set. It depends on the licences of its training data: set "
                 "it before publishing (`nmt export --license ID`, or `license`, `license_name` and `license_link` "
                 "at the top of README.md).\n")


@dataclass(frozen=True)
class CardConfig(Options):
    """The model card's licence (`nmt export --format transformers`)."""

    license: str = knob("other", "The Hub's licence identifier of the model (apache-2.0, cc-by-4.0, ...: it depends "
                        "on the training data's licences); other: see --license-name.")
    license_name: str = knob("unspecified", "With --license other: a short name of the licence.", only_if=_OTHER)
    license_link: str = knob("LICENSE", "With --license other: where its text is (a URL; LICENSE: a file written "
                             "beside the model, saying that the licence is not set).", only_if=_OTHER)


@dataclass(frozen=True)
class Evaluation:
    """A test set's scores: its file names and sacreBLEU's scores (BLEU, chrF) with signatures."""

    dataset: str
    scores: list[Score]
    search: str


def evaluate(model: Path, source: Path, reference: Path) -> Evaluation:
    """The checkpoint `model` translating `source` with its own search settings, scored against
    `reference` by sacreBLEU."""
    from nmt_cli.decode.translator import Translator
    from nmt_cli.lines import read_lines
    from nmt_cli.score import check_lengths, corpus_scores

    translator = Translator.load(model)
    hypotheses = list(translator.translate_iter(read_lines(source)))
    references = list(read_lines(reference))
    check_lengths(hypotheses, str(source), [references], [str(reference)])
    search = translator.config.search
    return Evaluation(f"{source.name}, {reference.name}", corpus_scores(hypotheses, [references], ("bleu", "chrf")),
                      f"beam {search.beam}, length penalty {search.lenpen:g}")


def model_card(bundle: ModelBundle, checkpoint: dict[str, Any], source: str, search_note: str,
               config: CardConfig, evaluations: list[Evaluation]) -> str:
    """README.md of the export; `search_note` says how `generate` searches beside `nmt translate`."""
    import yaml

    model, text = bundle.model.config, bundle.text
    pair = f"{text.source_lang}-{text.target_lang}"
    params = sum(p.numel() for p in bundle.model.parameters())  # a tied matrix counted once
    vocabulary = f"one vocabulary of {len(bundle.src_vocab):,} pieces for both sides" if bundle.shared else \
        f"{len(bundle.src_vocab):,} pieces in the source vocabulary, {len(bundle.tgt_vocab):,} in the target's"
    front: dict[str, Any] = {"license": config.license}
    if config.license == "other":
        front.update(license_name=config.license_name, license_link=config.license_link)
    front.update({"library_name": "transformers", "pipeline_tag": "translation",
                  "language": [text.source_lang, text.target_lang], "tags": ["translation", "nmt-cli"]})
    results = _results(checkpoint, evaluations, pair)
    if results:
        front["model-index"] = [{"name": f"{pair} Transformer", "results": results}]
    trained_on = _files(checkpoint, "train")
    lines = ["---", yaml.safe_dump(front, sort_keys=False, allow_unicode=True).rstrip(), "---", "",
             f"# {pair} Transformer", "",
             'The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), trained with nmt-cli '
             f"{checkpoint.get('nmt_cli_version', '')} and exported from `{source}` with `nmt export "
             "--format transformers`: a MarianMTModel that computes what nmt-cli's model computes.", "",
             "## Architecture", "",
             f"{model.encoder_layers} encoder and {model.decoder_layers} decoder layers, d_model {model.d_model}, "
             f"d_ff {model.d_ff}, {model.heads} heads, post-norm, {model.activation} FFN, sinusoidal positions: "
             f"{params:,} parameters. SentencePiece: {vocabulary}.", "",
             "## Training", ""]
    lines += _training(checkpoint) or ["Not recorded in the checkpoint."]
    if evaluations:
        lines += ["", "## Evaluation", ""]
        lines += [f"- {e.dataset} ({e.search}): " + "; ".join(s.text for s in e.scores) for e in evaluations]
    lines += ["", "## Intended use and limitations", "",
              f"Translation of {text.source_lang} text into {text.target_lang}, a sentence at a time, of the kind "
              f"of text it was trained on{f' ({trained_on})' if trained_on else ''}. Away from that kind of text "
              "its quality falls, often without a sign: a fluent translation can be a wrong one. It was not "
              "evaluated for bias, nor for uses where a wrong translation causes harm: have a person check what "
              f"matters. Inputs longer than {model.max_positions - 1} pieces are cut.",
              "", "## Use", "", "```python", "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer", "",
              'MODEL = "path/to/this/directory"  # or its name on the Hugging Face Hub',
              "tokenizer = AutoTokenizer.from_pretrained(MODEL)",
              "model = AutoModelForSeq2SeqLM.from_pretrained(MODEL)",
              'batch = tokenizer(["A sentence to translate."], return_tensors="pt", padding=True)',
              "print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))",
              "```", "", search_note, "", "## Citation", "", "```bibtex", CITATION, "```", ""]
    return "\n".join(lines)


def _results(checkpoint: dict[str, Any], evaluations: list[Evaluation], pair: str) -> list[dict[str, Any]]:
    """The model-index results: the best validation BLEU of training, then each test set's scores."""
    task = {"type": "translation", "name": f"Translation {pair}"}
    results = []
    progress = checkpoint.get("progress") or {}
    if progress.get("best_valid_bleu", -1) >= 0:
        valid = _files(checkpoint, "valid")
        results.append({"task": task, "dataset": {"name": valid or "valid", "type": "valid"},
                        "metrics": [{"type": "bleu", "value": round(progress["best_valid_bleu"], 2),
                                     "name": "best validation BLEU in training",
                                     "args": progress.get("bleu_signature") or "signature not recorded"}]})
    for evaluation in evaluations:
        results.append({"task": task, "dataset": {"name": evaluation.dataset, "type": "test"},
                        "metrics": [{"type": s.metric, "value": round(s.score, 2), "name": f"{s.metric} "
                                     f"({evaluation.search})", "args": s.signature} for s in evaluation.scores]})
    return results


def _files(checkpoint: dict[str, Any], split: str) -> str:
    """The names of a split's files as the checkpoint records them (not where they lay on the
    machine that trained); empty when not recorded."""
    return ", ".join(Path(f).name for f in ((checkpoint.get("data") or {}).get("inputs") or {}).get(split, []))


def _training(checkpoint: dict[str, Any]) -> list[str]:
    """The card's lines on the training data, the run and its validation, as far as recorded."""
    lines, data = [], checkpoint.get("data") or {}
    for split in data.get("inputs") or {}:
        pairs = (data.get("pairs") or {}).get(split)
        lines.append(f"- {split}: {_files(checkpoint, split)}" + (f" ({pairs:,} pairs)" if pairs else ""))
    progress = checkpoint.get("progress") or {}
    if "updates" in progress:
        lines.append(f"- updates: {progress['updates']:,}")
    if checkpoint.get("ema_decay"):
        lines.append(f"- the weights' exponential moving average (decay {checkpoint['ema_decay']:g})")
    averaged = checkpoint.get("averaged_from")
    if averaged:
        lines.append(f"- the average of {len(averaged)} checkpoints (updates "
                     f"{', '.join(str(a.get('updates')) for a in averaged)})")
    if math.isfinite(progress.get("best_valid_nll", math.inf)):
        lines.append(f"- best validation perplexity in training: {math.exp(progress['best_valid_nll']):.2f}")
    if progress.get("best_valid_bleu", -1) >= 0:
        train = checkpoint.get("train_config") or {}
        beam, lenpen = train.get("eval_bleu_beam"), train.get("eval_bleu_lenpen")
        lines.append(f"- best validation BLEU in training: {progress['best_valid_bleu']:.2f} (the valid split "
                     f"translated with beam {beam}, length penalty {lenpen}; sacreBLEU "
                     f"{progress.get('bleu_signature') or 'signature not recorded'})")
    return lines
