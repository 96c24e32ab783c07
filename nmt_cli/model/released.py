"""What a checkpoint keeps of the release its model came from (`nmt import`): kept through
fine-tuning and averaging, read by every command that runs the model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nmt_cli.config import SearchConfig


@dataclass(frozen=True)
class Released:
    """What a checkpoint keeps of where its model was released (`nmt import`), through fine-tuning
    too: the search options it is run with (the defaults of `nmt translate`, the Python API and
    the server; SearchConfig fields), the target tokens it never outputs, and its origin."""

    search: dict[str, Any] = field(default_factory=dict)
    never_output: tuple[str, ...] = ()
    origin: str | None = None

    def to_dict(self) -> dict[str, Any] | None:
        """The checkpoint's "released" entry (None for a model trained here from nothing)."""
        if self == Released():
            return None
        return {"search": dict(self.search), "never_output": list(self.never_output), "origin": self.origin}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Released:
        """The entry checked: a damaged one is a ValueError or TypeError naming what is wrong."""
        if d is None:
            return cls()
        if not isinstance(d, dict) or set(d) != {"search", "never_output", "origin"} or \
                not isinstance(d["search"], dict):
            raise ValueError("released is not a description of a released model")
        if not isinstance(d["origin"], (str, type(None))):
            raise TypeError("released.origin is not a string")
        SearchConfig(**d["search"])  # unknown options and bad values raise
        if not isinstance(d["never_output"], (list, tuple)) or not all(isinstance(t, str) for t in d["never_output"]):
            raise TypeError("released.never_output is not a list of tokens")
        return cls(dict(d["search"]), tuple(d["never_output"]), d["origin"])
