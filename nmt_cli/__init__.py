"""nmt-cli: the Transformer of "Attention Is All You Need", as a command-line toolkit and a
Python API (`from nmt_cli import Translator`)."""

from typing import Any

from nmt_cli.errors import NmtError
from nmt_cli.version import __version__

__all__ = ["NmtError", "Scored", "Translation", "Translator", "__version__"]


def __getattr__(name: str) -> Any:
    """`Translator` and its results are imported when first asked for: `nmt --help` and `nmt
    preprocess` never load torch."""
    if name == "Translator":
        from nmt_cli.translator import Translator

        return Translator
    if name in ("Scored", "Translation"):
        from nmt_cli import records

        return getattr(records, name)
    raise AttributeError(f"module 'nmt_cli' has no attribute {name!r}")
