"""The data directory `nmt preprocess` writes and `nmt train` reads: binarized splits, the BPE
codes, the vocabularies and `meta.json`, which describes them all (text settings, statistics,
versions) and holds the sha256 of every file, so that a truncated or edited file is refused."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from nmt_cli.config import TextConfig
from nmt_cli.corpus.data import ParallelData
from nmt_cli.errors import NmtError
from nmt_cli.files import MARKER
from nmt_cli.text.vocab import Vocabulary

FORMAT_VERSION = 1
META = "meta.json"
META_KEYS = ("text", "bpe_codes", "joined_dictionary", "dictionaries", "dtype", "splits", "checksums")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class DataDir:
    """A data directory and its `meta.json`."""

    def __init__(self, path: Path, meta: dict[str, Any]) -> None:
        self.path, self.meta = Path(path), meta

    @classmethod
    def open(cls, path: Path, verify: bool = False) -> DataDir:
        """Read `meta.json`; with `verify`, check every file it lists against its sha256."""
        data = cls(path, _read_meta(Path(path) / META, path))
        if verify:
            data.verify()
        return data

    @classmethod
    def write(cls, path: Path, meta: dict[str, Any]) -> DataDir:
        """Write `meta.json` describing `path`, with the checksum of every file in it."""
        files = sorted(p for p in Path(path).iterdir() if p.is_file() and p.name not in (MARKER, META))
        meta = {**meta, "checksums": {p.name: sha256(p) for p in files}}
        (Path(path) / META).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        return cls(path, meta)

    @staticmethod
    def files_of(path: Path) -> set[str] | None:
        """The names of the files an earlier `nmt preprocess` wrote in `path`, meta.json (and the
        marker of a publication killed before removing it) included; None without a readable
        meta.json."""
        try:
            return {META, MARKER, *json.loads((Path(path) / META).read_text(encoding="utf-8"))["checksums"]}
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def verify(self) -> None:
        for name, digest in self.meta["checksums"].items():
            file = self.path / name
            if not file.is_file():
                raise NmtError(f"{file}: missing from the data directory; run `nmt preprocess` again")
            if sha256(file) != digest:
                raise NmtError(f"{file}: differs from the checksum in meta.json (truncated, edited or corrupt); "
                               "run `nmt preprocess` again")

    @property
    def text(self) -> TextConfig:
        return TextConfig.from_dict(self.meta["text"])

    @property
    def joined_dictionary(self) -> bool:
        return self.meta["joined_dictionary"]

    def dictionary(self, lang: str) -> Path:
        return self.path / self.meta["dictionaries"][lang]

    def vocabularies(self) -> tuple[Vocabulary, Vocabulary]:
        text = self.text
        return Vocabulary.load(self.dictionary(text.source_lang)), Vocabulary.load(self.dictionary(text.target_lang))

    @property
    def bpe_codes_path(self) -> Path | None:
        return self.path / self.meta["bpe_codes"] if self.meta["bpe_codes"] else None

    def bpe_codes(self) -> str | None:
        path = self.bpe_codes_path
        return path.read_text(encoding="utf-8") if path is not None else None

    @property
    def sentencepiece_path(self) -> Path | None:
        name = self.meta.get("sentencepiece")  # absent from data directories made before SentencePiece
        return self.path / name if name else None

    def sentencepiece(self) -> bytes | None:
        path = self.sentencepiece_path
        return path.read_bytes() if path is not None else None

    @property
    def target_sentencepiece_path(self) -> Path | None:
        """The target side's own SentencePiece model, if it has one (released Marian models)."""
        name = self.meta.get("target_sentencepiece")
        return self.path / name if name else None

    def target_sentencepiece(self) -> bytes | None:
        path = self.target_sentencepiece_path
        return path.read_bytes() if path is not None else None

    @property
    def sampled_splits(self) -> list[str]:
        """The training split's sampled segmentations (--sentencepiece-samples), in order."""
        names = [name for name in self.meta["splits"] if name.startswith("train.sample")]
        return sorted(names, key=lambda name: int(name.removeprefix("train.sample")))

    def has_split(self, name: str) -> bool:
        return name in self.meta["splits"]

    def split(self, name: str) -> ParallelData:
        text = self.text
        return ParallelData.load(self.path, name, text.source_lang, text.target_lang, np.dtype(self.meta["dtype"]))

    def reuse(self, src: str, tgt: str) -> tuple[TextConfig, dict[str, Any]]:
        """`nmt preprocess --from-data`: this directory's text settings, and its BPE codes (or
        SentencePiece model) and vocabularies as PreprocessConfig fields."""
        text = self.text
        if (text.source_lang, text.target_lang) != (src, tgt):
            raise NmtError(f"{self.path}: prepared for {text.source_lang}-{text.target_lang}, not {src}-{tgt}")
        return text, {"bpe_codes": self.bpe_codes_path, "bpe_merges": 0, "sentencepiece_model": self.sentencepiece_path,
                      "target_sentencepiece_model": self.target_sentencepiece_path,
                      "srcdict": self.dictionary(src), "tgtdict": self.dictionary(tgt)}


def _read_meta(path: Path, data_dir: Path) -> dict[str, Any]:
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise NmtError(f"{path}: not found; is {data_dir} a directory made by `nmt preprocess`?") from None
    except (OSError, ValueError) as e:
        raise NmtError(f"{path}: unreadable ({e})") from None
    if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
        version = meta.get("format_version") if isinstance(meta, dict) else None
        raise NmtError(f"{path}: data format version {version}, "
                       f"this nmt-cli reads version {FORMAT_VERSION}; run `nmt preprocess` again")
    missing = [key for key in META_KEYS if key not in meta]
    if missing:
        raise NmtError(f"{path}: incomplete (no {missing[0]!r}); run `nmt preprocess` again")
    return meta
