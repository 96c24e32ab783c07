"""Atomic files: everything is written under a temporary name beside its target, then renamed.

A killed process leaves at most a hidden `.NAME.tmp-PID`, never a file or directory that looks
complete; `remove_stale_temporaries` clears those of processes that no longer run.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def temporary(path: Path) -> Path:
    """The temporary name of `path` for this process: `.NAME.tmp-PID` in the same directory."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def write_text(path: Path, text: str) -> None:
    tmp = temporary(path)
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def remove_stale_temporaries(directory: Path) -> None:
    """Delete `.NAME.tmp-PID` files or directories left by a killed process that no longer runs."""
    for path in Path(directory).glob(".*.tmp-*"):
        pid = path.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
