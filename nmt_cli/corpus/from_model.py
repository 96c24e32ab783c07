"""`nmt preprocess --from-model`: data prepared as a model reads its text (its tokenizer settings,
subword models and vocabularies), to fine-tune it on with `nmt train --init-from`; data in other
languages than the model's, or that its subwords cut far worse than the text they were made for,
is warned of (fine-tuning then starts far from what the model learned)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nmt_cli.config import TextConfig
from nmt_cli.errors import NmtError
from nmt_cli.lines import input_path, read_lines
from nmt_cli.text.processor import TextProcessor
from nmt_cli.text.vocab import UNK_ID

if TYPE_CHECKING:
    from nmt_cli.model.checkpoint import ModelBundle  # torch: only when a model is read


SAMPLE_LINES = 1000  # of each side of the training data, to see how the model's subwords cut it
PIECES_PER_WORD = 2.0  # OPUS-MT en-mg's source.spm: 1.2 a word of Multi30k's English, 2.8 of its German
UNKNOWN_SHARE = 0.01


def model_pipeline(checkpoint: Path, directory: Path, src: str, tgt: str, warn: Callable[[str], None] = print,
                   sample: Path | None = None) -> tuple[TextConfig, dict[str, Any]]:
    """`nmt preprocess --from-model`: the checkpoint's text settings, and its BPE codes (or
    SentencePiece models) and vocabularies written into `directory` as PreprocessConfig fields.
    The languages are the files' suffixes; with Moses they must be the model's own, with
    SentencePiece others are warned of (the model's subwords were made for its own), as is
    training data at prefix `sample` that they cut badly (`cut_warnings`)."""
    from nmt_cli.model.checkpoint import load_bundle  # torch: only when a model is read

    bundle = load_bundle(checkpoint)
    text = bundle.text
    if (text.source_lang, text.target_lang) != (src, tgt):
        if not text.sentencepiece:
            raise NmtError(f"{checkpoint}: its Moses tokenizer is for {text.source_lang}-{text.target_lang}, not "
                           f"{src}-{tgt}")
        warn(f"warning: {checkpoint} translates {text.source_lang}-{text.target_lang}, the data is {src}-{tgt}: "
             "its vocabularies and subwords were made for its own languages (the summary's token counts and "
             "unknown rates say how well they cut this data)")
        text = dataclasses.replace(text, source_lang=src, target_lang=tgt)
    for line in cut_warnings(bundle, text, sample) if sample is not None else ():
        warn(line)
    files: dict[str, Any] = {"bpe_merges": 0}
    for key, name, content in (("bpe_codes", "bpe.codes", bundle.bpe_codes),
                               ("sentencepiece_model", "spm.model", bundle.sentencepiece),
                               ("target_sentencepiece_model", "spm.target.model", bundle.target_sentencepiece)):
        files[key] = None
        if content is not None:
            files[key] = directory / name
            files[key].write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    for key, vocab in (("srcdict", bundle.src_vocab), ("tgtdict", bundle.tgt_vocab)):
        spaced = next((t for t in vocab.tokens if not t or any(c.isspace() for c in t)), None)
        if spaced is not None:
            raise NmtError(f"{checkpoint}: its vocabulary holds {spaced!r}, which a vocabulary file cannot")
        files[key] = directory / f"{key}.txt"
        vocab.save(files[key])
    return text, files


def cut_warnings(bundle: ModelBundle, text: TextConfig, prefix: Path) -> list[str]:
    """A warning for each side of the training data at `prefix` (its first SAMPLE_LINES lines)
    that the model's subwords cut into more than PIECES_PER_WORD tokens a word, or into more than
    UNKNOWN_SHARE unknown ones."""
    found = []
    for side, lang, vocab in (("source", text.source_lang, bundle.src_vocab),
                              ("target", text.target_lang, bundle.tgt_vocab)):
        processor, path = TextProcessor(text, lang, bundle.bpe_codes, bundle.pieces(side)), input_path(prefix, lang)
        words = tokens = unknown = 0
        for line in itertools.islice(read_lines(path), SAMPLE_LINES):
            pieces = processor.encode(line)
            words, tokens, unknown = words + len(line.split()), tokens + len(pieces), \
                unknown + vocab.encode(pieces).count(UNK_ID)
        if words and tokens and (tokens / words > PIECES_PER_WORD or unknown / tokens > UNKNOWN_SHARE):
            found.append(f"warning: {path}: the model's subwords cut it into {tokens / words:.1f} tokens a word, "
                         f"{unknown / tokens:.1%} of them unknown (more than {PIECES_PER_WORD:g}, or "
                         f"{UNKNOWN_SHARE:.0%}: text they were not made for): fine-tuning starts far from what the "
                         "model learned")
    return found
