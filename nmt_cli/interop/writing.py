"""What `nmt export`'s writers share: the output folder, checked (only an earlier export is ever
replaced: a user's files are never deleted) and written whole or not at all; the text pipeline's
files beside a model (its BPE codes or SentencePiece models, and `nmt-cli.json`, which says how text
becomes the model's tokens and back, with the search it runs); JSON files."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nmt_cli.config import SearchConfig
from nmt_cli.errors import NmtError
from nmt_cli.files import MARKER, write_directory
from nmt_cli.interop.formats import export_files
from nmt_cli.model.checkpoint import ModelBundle


def check_destination(out: Path) -> None:
    """Refuse to replace anything but an earlier export: a user's files are never deleted."""
    if Path.cwd().resolve().is_relative_to(out.resolve()):
        raise NmtError(f"{out}: is the current directory or holds it; choose a new --output")
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir():
        raise NmtError(f"{out}: exists and is not a directory; choose another --output")
    names = {p.name for p in out.iterdir()} - {MARKER}  # a marker: a publication killed before removing it
    if names and ("nmt-cli.json" not in names or not names <= export_files()):
        raise NmtError(f"{out}: the directory holds files that are not an earlier export; choose another "
                       "--output or empty it")


def write_export(out: Path, write: Callable[[Path], None]) -> None:
    """`write` the export where it replaces only an earlier export (files.write_directory)."""
    out = Path(os.path.abspath(out))  # `-o .` has no name to put a temporary beside
    write_directory(out, "model directory", write, lambda: check_destination(out))


def text_files(bundle: ModelBundle, out: Path) -> None:
    """The subword model and `nmt-cli.json`: how text becomes the model's tokens and back."""
    text = bundle.text
    if bundle.bpe_codes is not None:
        (out / "bpe.codes").write_text(bundle.bpe_codes, encoding="utf-8")
    if bundle.sentencepiece is not None:
        (out / "spm.model").write_bytes(bundle.sentencepiece)
    target = "spm.model"
    if bundle.target_sentencepiece is not None:
        (out / "spm.target.model").write_bytes(bundle.target_sentencepiece)
        target = "spm.target.model"
    if text.sentencepiece:
        code = "; a leading >>code<< stays one piece" if text.language_codes else ""
        steps = [f"encode the line with spm.model (SentencePiece) into pieces{code}; the model adds </s> itself",
                 f"decode the output pieces with {target}"]
    else:
        steps = [f"Moses punctuation normalization and tokenization (sacremoses, lang {text.source_lang}, "
                 "escape=False) with the settings below" if text.tokenizer == "moses" else "split on whitespace",
                 "apply bpe.codes with subword-nmt (separator @@)" if bundle.bpe_codes else "no BPE",
                 "translate the tokens; the model adds </s> to the source itself",
                 "join '@@ ' in the output, then Moses detokenization (lang "
                 f"{text.target_lang})" if text.tokenizer == "moses" else "join '@@ ' in the output"]
    search = SearchConfig(**bundle.released.search)
    form = "by |Y|^alpha, as CTranslate2 does" if search.lenpen_form == "length" else \
        "by ((5 + |Y|) / 6)^alpha (GNMT); CTranslate2 and transformers by |Y|^alpha"
    if search.lenpen_start:
        form += ", with |Y| counting <s> too (OpenNMT-py's)"
    about = {"text_config": text.to_dict(), "steps": steps, "model_config": bundle.model.config.to_dict(),
             "released": bundle.released.to_dict(),  # what `nmt import` of the export takes back
             "search": {"beam_size": search.beam, "length_penalty": search.lenpen,
                        "max_decoding_length": bundle.model.config.max_positions - 1,
                        "min_decoding_length": search.min_len, "no_repeat_ngram_size": search.no_repeat_ngram_size,
                        "repetition_penalty": search.repetition_penalty,
                        "note": f"nmt-cli divides scores {form}; its repetition_penalty multiplies the "
                                "log-probabilities of tokens already output, as transformers' beam search does"}}
    (out / "nmt-cli.json").write_text(json.dumps(about, indent=2) + "\n", encoding="utf-8")


def write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
