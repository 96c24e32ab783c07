"""Reading text: lines of UTF-8 (checked, each error naming its line), gzipped files, aligned
pairs of files, and chunks of lines for batching and for worker processes."""

from __future__ import annotations

import gzip
import os
import select
import stat
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from nmt_cli.errors import NmtError


def line_count(path: Path) -> int:
    """The lines of a (possibly gzipped) file (a last line without its newline counts too), read
    in blocks: a progress bar's total."""
    count, last = 0, b"\n"
    with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as stream:
        while block := stream.read(1 << 20):
            count, last = count + block.count(b"\n"), block[-1:]
    return count + (last != b"\n")


def decode_lines(stream: IO[bytes], name: str) -> Iterator[str]:
    """Lines of a binary stream without their newline; invalid UTF-8 is an error naming the line.

    Only "\n" ends a line (Unicode line separators inside a sentence stay part of it). A byte-order
    mark opening the stream is no text (Windows editors write one): it would become a word.
    """
    for number, raw in enumerate(stream, start=1):
        line = _decode(raw, name, number)
        yield line.removeprefix("\ufeff") if number == 1 else line


def _decode(raw: bytes, name: str, number: int) -> str:
    try:
        return raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as e:
        raise NmtError(f"{name}:{number}: invalid UTF-8 (byte {e.start + 1}: {e.reason})") from None


PAUSE_SECONDS = 0.05


def arriving_chunks(stream: IO[bytes], name: str, size: int, pause: float = PAUSE_SECONDS) -> Iterator[list[str]]:
    """Chunks of at most `size` lines of `stream`; one that is not a regular file (a pipe, a
    terminal) also hands on what has arrived whenever its input pauses for `pause` seconds, so a
    program that writes a line and waits for its answer gets it (as from fairseq-interactive or
    marian-decoder), while a fast writer still fills whole chunks."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError):  # an in-memory stream
        fd = None
    if fd is None or stat.S_ISREG(os.fstat(fd).st_mode):
        yield from chunks(decode_lines(stream, name), size)
        return
    lines: list[str] = []
    pending, number, ended = b"", 0, False
    while not ended:
        if select.select([fd], [], [], pause if lines else None)[0]:
            data = os.read(fd, 1 << 16)
            ended = not data
            *complete, pending = (pending + data).split(b"\n") if data else [pending, b""]
            for raw in complete:
                if raw or not ended:  # the text after the last newline is a line only if it has any
                    number += 1
                    lines.append(_decode(raw, name, number))
            while len(lines) >= size:
                yield lines[:size]
                lines = lines[size:]
            if not ended:
                continue
        if lines:
            yield lines
            lines = []


def chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """Consecutive lists of `size` items (the last may be shorter)."""
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def input_path(prefix: str, lang: str) -> Path:
    """`PREFIX.LANG`, or `PREFIX.LANG.gz` when only that exists."""
    path = Path(f"{prefix}.{lang}")
    if not path.exists() and Path(f"{path}.gz").exists():
        return Path(f"{path}.gz")
    if not path.is_file():
        raise NmtError(f"{path}: no such file")
    return path


def read_lines(path: Path) -> Iterator[str]:
    """Lines of a (possibly gzipped) file; invalid UTF-8 is an error naming the line, and so is a
    gzipped file that ends early or is damaged (gzip's EOFError would read as Ctrl-D: "Aborted!")."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            yield from decode_lines(f, str(path))
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise NmtError(f"{path}: a truncated or damaged gzip file ({e})") from None


def read_pairs(src: Path, tgt: Path) -> Iterator[tuple[str, str]]:
    """Aligned lines of two files; a difference in line counts is an error naming both files."""
    src_lines, tgt_lines = read_lines(src), read_lines(tgt)
    number = 0
    for number, s in enumerate(src_lines, start=1):
        t = next(tgt_lines, None)
        if t is None:
            raise NmtError(f"{tgt}:{number}: file ends here, but {src} has more lines (line counts differ)")
        yield s, t
    if next(tgt_lines, None) is not None:
        raise NmtError(f"{src}:{number + 1}: file ends here, but {tgt} has more lines (line counts differ)")
