"""Shared test helpers. Real data is read from ../shared/data (or $NMT_SHARED_DATA), never copied."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("NMT_SHARED_DATA", ROOT.parent / "shared" / "data"))
MULTI30K = SHARED_DATA / "multi30k"


@pytest.fixture
def multi30k() -> Path:
    if not (MULTI30K / "train.en").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K} (set NMT_SHARED_DATA)")
    return MULTI30K


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def head(path: Path, n: int) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(n)]
