"""The interop wing's table of formats: each reader of `nmt import` and each writer of `nmt export`,
with its name, the module that holds it (imported only when that format is chosen: each needs its
own optional packages), the files it reads or writes and the options it takes, as CTranslate2's
converters share one base. A new format is a row here and a module beside this one; the neutral
description between them is release.Release (in) and a checkpoint (out). Torch-free: choosing a
format imports nothing heavy.

A writer's function takes an exporter.ExportRequest; a reader's takes the source path, the
ImportConfig and a function that warns, and gives a release.Release."""

from __future__ import annotations

import importlib
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from nmt_cli.errors import NmtError


@dataclass(frozen=True)
class Format:
    """A row of the table: its name, and its function in a module below nmt_cli.interop."""

    name: str
    module: str
    function: str

    def entry(self) -> Callable[..., Any]:
        """The function, its module imported now (and only now)."""
        return getattr(importlib.import_module(f"nmt_cli.interop.{self.module}"), self.function)


@dataclass(frozen=True)
class Writer(Format):
    """A format `nmt export` writes: a directory of `files` (none: a single file)."""

    files: frozenset[str]
    options: tuple[str, ...]  # the ExportConfig fields it takes besides --format
    summary: str
    suffix: str | None = None  # a single file's: what its name ends in


@dataclass(frozen=True)
class Reader(Format):
    """A format `nmt import` reads, told by what `recognizes` finds at the source path."""

    recognizes: Callable[[Path], bool]
    options: tuple[str, ...]  # the ImportConfig fields it takes
    summary: str


# The text pipeline's files beside a model's (writing.text_files) and nmt-cli.json, which every
# directory export holds.
TEXT_FILES = frozenset({"bpe.codes", "spm.model", "spm.target.model", "nmt-cli.json"})
CTRANSLATE2_FILES = frozenset({"model.bin", "config.json", "shared_vocabulary.json", "source_vocabulary.json",
                               "target_vocabulary.json", "vmap.txt"})
TRANSFORMERS_FILES = frozenset({"config.json", "model.safetensors", "generation_config.json", "source.spm",
                                "target.spm", "vocab.json", "target_vocab.json", "tokenizer_config.json", "README.md",
                                "LICENSE"})
ONNX_FILES = frozenset({"onnx", "config.json", "generation_config.json", "shared_vocabulary.json",
                        "source_vocabulary.json", "target_vocabulary.json", "tokenizer.json", "tokenizer_config.json"})

WRITERS = {writer.name: writer for writer in (
    Writer("ctranslate2", "export_ctranslate2", "export", CTRANSLATE2_FILES | TEXT_FILES, ("quantization", "shortlist"),
           "a CTranslate2 model directory"),
    Writer("argos", "export_argos", "export", frozenset(),
           ("quantization", "sentences", "package_version", "from_name", "to_name"),
           "an Argos Translate package", ".argosmodel"),
    Writer("transformers", "export_transformers", "export", TRANSFORMERS_FILES | TEXT_FILES, (),
           "a Hugging Face MarianMTModel directory with its tokenizer and a model card"),
    Writer("onnx", "export_onnx", "export", ONNX_FILES | TEXT_FILES, ("quantization",),
           "ONNX graphs for onnxruntime and transformers.js"),
    Writer("web", "export_web", "export", frozenset({"index.html", "model", "vendor"}),
           ("quantization", "transformers_js"), "a static page that translates in the browser"),
    Writer("safetensors", "exporter", "export", frozenset(), (), "one safetensors file", ".safetensors"),
)}


def export_files() -> frozenset[str]:
    """What any directory export writes: a directory holding only these (and nmt-cli.json) is an
    earlier export, which a new one may replace."""
    return frozenset().union(*(writer.files for writer in WRITERS.values()))


TEXT_OPTIONS = ("source_lang", "target_lang", "bpe_codes", "sentencepiece", "tokenizer")
CHECKPOINT_OPTIONS = (*TEXT_OPTIONS, "data_dir")


def is_argos_package(path: Path) -> bool:
    """An Argos package's folder, or a zip holding one folder with metadata.json (torch's
    checkpoints are zips too: told apart by that file)."""
    if path.is_dir():
        return (path / "metadata.json").is_file() and (path / "model").is_dir()
    try:
        with zipfile.ZipFile(path) as z:
            return any(PurePosixPath(n).name == "metadata.json" and len(PurePosixPath(n).parts) == 2
                       for n in z.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


READERS = (
    Reader("argos", "import_argos", "read_argos", is_argos_package, TEXT_OPTIONS,
           "an Argos Translate package (.argosmodel, or its folder)"),
    Reader("ctranslate2", "import_ctranslate2", "read_ctranslate2", lambda path: (path / "model.bin").is_file(),
           TEXT_OPTIONS, "a CTranslate2 model (model.bin)"),
    Reader("transformers", "import_transformers", "read_transformers",
           lambda path: (path / "config.json").is_file(), (), "a transformers model (config.json)"),
    Reader("marian", "import_marian", "read_marian", lambda path: path.is_dir() and any(path.glob("*.npz")), (),
           "a Marian one (*.npz)"),
    Reader("checkpoint", "importer", "read_checkpoint_file", Path.is_file, CHECKPOINT_OPTIONS,
           "a checkpoint file (fairseq's, OpenNMT-py's)"),
)


def reader_for(source: Path) -> Reader:
    """The reader of what is at `source`, or a one-line error saying what it is not."""
    if not source.is_file() and not source.is_dir():
        raise NmtError(f"{source}: neither a directory (a released model) nor a file (a fairseq or OpenNMT-py "
                       "checkpoint)")
    for reader in READERS:
        if reader.recognizes(source):
            return reader
    directories = [reader.summary for reader in READERS if reader.recognizes is not Path.is_file]
    raise NmtError(f"{source}: neither {' nor '.join(directories)}")
