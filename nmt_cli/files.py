"""Files that are either complete or absent, and directories one run at a time.

Everything is written under a temporary name beside its target, then renamed. A temporary is
`.NAME.nmt-tmp-HOST-PID-TOKEN` with a random 16-hex-digit TOKEN, so no file a user made can
match it; the process that made it removes it on failure and on SIGINT/SIGTERM (`on_sigterm`).
`remove_stale_temporaries` clears only temporaries of that exact shape made on this host by a
process that no longer runs (one killed by SIGKILL); directories also need the marker file that
`temporary_directory` writes inside them. A user's file is never touched.

`DirectoryLock` holds an OS file lock (flock) for a run: the kernel releases it when the process
dies, so a killed run never blocks the next, and a second run is refused naming the holder.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import fcntl
import os
import re
import secrets
import shutil
import signal
import socket
import stat
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from nmt_cli.errors import NmtError

HOST = re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname()) or "host"
TEMPORARY = re.compile(r"^\.(?P<name>.+)\.nmt-tmp-(?P<host>[A-Za-z0-9_.]+)-(?P<pid>\d+)-[0-9a-f]{16}$")
MARKER = ".nmt-temporary"  # inside a temporary directory: proof that nmt made it
T = TypeVar("T")


def temporary(path: Path) -> Path:
    """A fresh temporary name for `path`, in the same directory (so renaming it is atomic)."""
    path = Path(path)
    return path.with_name(f".{path.name}.nmt-tmp-{HOST}-{os.getpid()}-{secrets.token_hex(8)}")


def reason(error: OSError) -> str:
    """'No space left on device', 'Read-only file system', 'Name or service not known', ... for a
    one-line message."""
    if isinstance(error.errno, int) and error.errno > 0:
        return os.strerror(error.errno)
    return error.strerror or str(error)  # an address lookup's error numbers are negative


@contextlib.contextmanager
def replacing(path: Path, what: str = "file") -> Iterator[Path]:
    """Yield a temporary file name; when the block ends normally, rename it over `path`; when it
    fails or is interrupted, remove it. An OSError becomes a one-line NmtError naming `path`."""
    path = Path(path)
    tmp = temporary(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as e:
        raise NmtError(f"{path}: cannot write {what} ({reason(e)})") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


KINDS = ((stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "FIFO"),
         (stat.S_ISSOCK, "socket"))


def destination(path: Path, what: str, stream: str = "", inputs: Iterable[Path] = ()) -> Path:
    """Where a command writes the `what` its user named `path`: through a symbolic link, the file
    or directory it points to (written atomically there, the link kept). Refused in one line,
    before the command reads anything: one of its `inputs` (the file, inside the directory, or
    inside the directory the output replaces, through links too), a device, FIFO or socket (a
    rename would replace it; `stream` says how to write into it instead), and a file with other
    hard links (a rename would part it from them)."""
    path = Path(path)
    for given in inputs:
        if (relation := overlap(path, Path(given))) is not None:
            raise NmtError(f"{path}: {relation} the input {given}: writing the {what} there would destroy it; choose "
                           "another path")
    real = Path(os.path.realpath(path)) if path.is_symlink() else path
    try:
        info = real.stat()
    except OSError:
        return real  # a new path (or one the write will name in its own error)
    kind = next((name for test, name in KINDS if test(info.st_mode)), None)
    if kind is not None:
        raise NmtError(f"{path}: a {kind}, not a regular file: the {what} is written to files, atomically"
                       + (f"; {stream}" if stream else ""))
    if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        raise NmtError(f"{path}: a file with {info.st_nlink - 1} other hard link(s); writing the {what} in its place "
                       "would part it from them: remove it first, or choose another path")
    return real


_reads: contextvars.ContextVar[list[Path] | None] = contextvars.ContextVar("reads", default=None)


@contextlib.contextmanager
def reads_recorded() -> Iterator[list[Path]]:
    """The files read inside the block (`small_file`, and every reader's `note_read`): what an
    output must not replace, however the command came to read them (beside a checkpoint, named by
    its options), not only the paths its user typed."""
    reads: list[Path] = []
    token = _reads.set(reads)
    try:
        yield reads
    finally:
        _reads.reset(token)


def note_read(path: Path) -> None:
    """Record that `path` is read, for `reads_recorded`."""
    if (reads := _reads.get()) is not None:
        reads.append(Path(path))


def not_read(output: Path, reads: Iterable[Path], what: str) -> None:
    """Refuse, in one line and before writing, an `output` that is one of the files a command read
    (`reads_recorded`): writing the `what` there would destroy it."""
    for path in reads:
        if overlap(output, path) is not None:
            raise NmtError(f"{output}: the file {path}, which this {what} read: writing there would destroy it; "
                           "choose another path")


def small_file(path: Path, what: str, limit: int) -> bytes:
    """The bytes of `path`, a regular file of at most `limit` bytes (options, keys, a tokenizer's
    model, a configuration; not a device or FIFO that never ends, nor data given by mistake).
    Refused in one line naming `path` and `what` it should be."""
    path = Path(path)
    note_read(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens without waiting for a writer
    except OSError as e:
        raise NmtError(f"{path}: cannot read {what} ({reason(e)})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = next((name for test, name in KINDS if test(info.st_mode)), "directory")
            raise NmtError(f"{path}: a {kind}, not a regular file ({what} is one)")
        data = os.read(fd, limit + 1)  # a file that grows as it is read stops here too
        while len(data) <= limit and (more := os.read(fd, limit + 1 - len(data))):
            data += more
    except OSError as e:
        raise NmtError(f"{path}: cannot read {what} ({reason(e)})") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        size = f"{info.st_size:,} bytes" if info.st_size > limit else f"over {limit:,} bytes"
        raise NmtError(f"{path}: {size}; {what} is at most {limit:,}")
    return data


def overlap(output: Path, given: Path) -> str | None:
    """How writing `output` would reach the input `given` (None: it would not): as the input
    itself, inside the input's directory, or replacing a directory that holds it, through links
    too (a hard link to an input is refused as every hard-linked output is: `destination`)."""
    out, source = Path(os.path.realpath(output)), Path(os.path.realpath(given))
    if out == source:
        return "is"
    if out.is_relative_to(source):
        return "is inside"
    if source.is_relative_to(out):
        return "holds"
    return None


def write_text(path: Path, text: str) -> None:
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def temporary_directory(path: Path) -> Path:
    """Create a temporary directory for `path`, marked as nmt's."""
    tmp = temporary(path)
    tmp.mkdir()
    (tmp / MARKER).touch()
    return tmp


def write_directory(path: Path, what: str, write: Callable[[Path], T], check: Callable[[], None]) -> T:
    """`write` a marked temporary directory beside `path`, then rename it to `path`: a failed or
    interrupted write leaves `path` as it was. `check` refuses a destination that may not be
    replaced (a user's files); it runs before, and again just before the rename (another program
    may have written there meanwhile). An OSError is a one-line NmtError naming `what`."""
    check()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path.parent)
        tmp = temporary_directory(path)
    except OSError as e:
        raise NmtError(f"{path.parent}: cannot write there ({reason(e)})") from None
    try:
        result = write(tmp)
        check()
        _publish_directory(tmp, path)
        return result
    except OSError as e:
        raise NmtError(f"{path}: cannot write the {what} ({reason(e)}); nothing was written") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _publish_directory(tmp: Path, path: Path) -> None:
    """Rename the finished temporary directory `tmp` to `path`, replacing what is there. Whatever
    moment a kill comes, what is left under a temporary name holds the marker (and is swept), and
    `path` is the old directory or the new one (which may still hold the marker: a harmless file)."""
    old = None
    if path.exists():
        old = temporary(path)
        if path.is_dir() and not path.is_symlink():
            (path / MARKER).touch()
        path.rename(old)
    tmp.rename(path)
    (path / MARKER).unlink()
    if old is not None:
        shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()


def remove_stale_temporaries(directory: Path) -> None:
    """Delete nmt's temporaries in `directory` left by processes of this host that no longer run."""
    for path in Path(directory).glob(".*.nmt-tmp-*"):
        match = TEMPORARY.match(path.name)
        if not match or match["host"] != HOST or _alive(int(match["pid"])):
            continue
        with contextlib.suppress(OSError):
            if path.is_dir() and not path.is_symlink():
                if (path / MARKER).is_file():
                    shutil.rmtree(path)
                elif not any(path.iterdir()):  # killed between its mkdir and its marker
                    path.rmdir()
            else:
                path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class DirectoryLock:
    """An exclusive flock on `LOCK_PATH` while a run works on a directory.

    The lock file holds the holder's PID and host, for the refusal message; it is removed on
    release (a waiter that opened the removed file notices and retries on the new one).
    """

    def __init__(self, path: Path, what: str) -> None:
        self.path, self.what = Path(path), what
        self.fd: int | None = None

    def acquire(self) -> DirectoryLock:
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise NmtError(f"{self.path}: cannot create the lock of {self.what} ({reason(e)})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = os.read(fd, 200).decode("utf-8", "replace").strip() or "another process"
                os.close(fd)
                if e.errno in (errno.EAGAIN, errno.EACCES):
                    raise NmtError(f"{self.what} is in use by {holder} (lock {self.path}); wait for that run to "
                                   "end, or use another directory") from None
                raise NmtError(f"{self.path}: cannot lock {self.what} ({reason(e)})") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder removed this file as we opened it: lock the new one
        os.ftruncate(fd, 0)
        os.write(fd, f"process {os.getpid()} on {socket.gethostname()}\n".encode())
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()
        os.close(self.fd)
        self.fd = None

    def __enter__(self) -> DirectoryLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def on_sigterm(signum: int, _frame: object) -> None:
    """SIGTERM as Ctrl-C, so that `finally` blocks remove temporaries before the process ends."""
    raise KeyboardInterrupt(f"signal {signum}")


def handle_sigterm() -> None:
    """Install `on_sigterm` (where SIGTERM has its default action) in this process only: a forked
    child (a preprocessing worker) keeps the default, so that terminating it always ends it."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, on_sigterm)
        os.register_at_fork(after_in_child=_default_sigterm)


def _default_sigterm() -> None:
    if signal.getsignal(signal.SIGTERM) is on_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
