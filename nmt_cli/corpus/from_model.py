"""`nmt preprocess --from-model`: data prepared as a model reads its text (its tokenizer settings,
subword models and vocabularies), to fine-tune it on with `nmt train --init-from`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nmt_cli.config import TextConfig
from nmt_cli.errors import NmtError


def model_pipeline(checkpoint: Path, directory: Path, src: str, tgt: str,
                   warn: Callable[[str], None] = print) -> tuple[TextConfig, dict[str, Any]]:
    """`nmt preprocess --from-model`: the checkpoint's text settings, and its BPE codes (or
    SentencePiece models) and vocabularies written into `directory` as PreprocessConfig fields.
    The languages are the files' suffixes; with Moses they must be the model's own, with
    SentencePiece others are warned of (the model's subwords were made for its own)."""
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
