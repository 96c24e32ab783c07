"""Argos Translate packages read into a `Release`: an `.argosmodel` file (a zip of one folder) or an
installed package's folder, holding `metadata.json` (the pair), `model/` (a CTranslate2 model:
import_ctranslate2.py) and its text pipeline (`sentencepiece.model`, or `bpe.model` after Moses).
A published package holds only int8 weights, which come back as CTranslate2 computes with them
(q / scale): the model fine-tunes from there. Its search is Argos's (export_argos.ARGOS_SEARCH).

The zip is read with every name, size and count checked before anything is written: no name
outside the package's folder, no link, at most MAX_MEMBERS files and MAX_BYTES in all, each file
no longer than its entry says."""

from __future__ import annotations

import contextlib
import shutil
import stat
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath

from nmt_cli.errors import NmtError
from nmt_cli.files import note_read
from nmt_cli.interop.export_argos import ARGOS_SEARCH
from nmt_cli.interop.import_ctranslate2 import ctranslate2_release
from nmt_cli.interop.reading import read_json
from nmt_cli.interop.release import Release
from nmt_cli.run_config import ImportConfig

MAX_MEMBERS = 10_000
MAX_BYTES = 16 << 30  # the largest published packages are a few hundred MB
CHUNK = 1 << 20


def read_argos(source: Path, options: ImportConfig, warn: Callable[[str], None]) -> Release:
    """An Argos package (file or folder), its languages from metadata.json unless `options` name them."""
    with package_folder(source) as folder:
        metadata = read_json(folder / "metadata.json")
        if not isinstance(metadata, dict):
            raise NmtError(f"{source}: its metadata.json is not a JSON object")
        if metadata.get("target_prefix"):
            raise NmtError(f"{source}: a multilingual package (target_prefix {metadata['target_prefix']!r}), which "
                           "nmt-cli's models do not take")
        if metadata.get("type", "translate") != "translate":
            raise NmtError(f"{source}: a package of type {metadata.get('type')!r}, not a translation model")
        langs = (options.source_lang or _code(metadata, "from_code", source),
                 options.target_lang or _code(metadata, "to_code", source))
        if not (folder / "model" / "model.bin").is_file():
            raise NmtError(f"{source}: no model/model.bin (the package's CTranslate2 model)")
        origin = f"Argos Translate ({langs[0]}-{langs[1]} package {metadata.get('package_version', '?')})"
        return ctranslate2_release(folder / "model", folder, options, warn, langs, origin, dict(ARGOS_SEARCH))


def _code(metadata: dict, key: str, source: Path) -> str:
    value = metadata.get(key)
    if not isinstance(value, str) or not value:
        raise NmtError(f"{source}: metadata.json names no {key}: give -s SRC -t TGT")
    return value


@contextlib.contextmanager
def package_folder(source: Path) -> Iterator[Path]:
    """The package's folder: `source` itself, or the zip's one folder extracted into a temporary one."""
    if source.is_dir():
        yield source
        return
    with tempfile.TemporaryDirectory(prefix="nmt-argos-") as tmp:
        yield extract(source, Path(tmp))


def extract(source: Path, into: Path) -> Path:
    """The zip's files under `into`, every entry checked first; the package's folder."""
    note_read(source)
    try:
        with zipfile.ZipFile(source) as z:
            members = z.infolist()
            check_members(members, source)
            for member in members:
                target = into.joinpath(*PurePosixPath(member.filename).parts)
                if member.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with z.open(member) as f, open(target, "wb") as out:
                    copied = 0
                    while chunk := f.read(CHUNK):
                        copied += len(chunk)
                        if copied > member.file_size:
                            raise NmtError(f"{source}: {member.filename} is longer than its entry says")
                        out.write(chunk)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as e:
        raise NmtError(f"{source}: not a readable Argos package ({e})") from None
    except OSError as e:
        raise NmtError(f"{source}: cannot extract it ({e.strerror or e})") from None
    tops = {PurePosixPath(m.filename).parts[0] for m in members}
    return into / tops.pop()


def check_members(members: list[zipfile.ZipInfo], source: Path) -> None:
    """One folder of regular files within bounds, or a one-line refusal naming the entry."""
    if len(members) > MAX_MEMBERS:
        raise NmtError(f"{source}: {len(members):,} entries, more than an Argos package holds")
    total = 0
    for member in members:
        parts = PurePosixPath(member.filename).parts
        if not parts or member.filename.startswith("/") or ".." in parts or "\\" in member.filename:
            raise NmtError(f"{source}: entry {member.filename!r} points outside the package's folder")
        if stat.S_ISLNK(member.external_attr >> 16):
            raise NmtError(f"{source}: entry {member.filename!r} is a link")
        total += member.file_size
    if total > MAX_BYTES or total > shutil.disk_usage(tempfile.gettempdir()).free:
        raise NmtError(f"{source}: {total:,} bytes unpacked, more than there is room for")
    if len({PurePosixPath(m.filename).parts[0] for m in members}) != 1:
        raise NmtError(f"{source}: not one folder (an Argos package is a zip of one folder)")
