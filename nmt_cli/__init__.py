"""nmt-cli: the Transformer of "Attention Is All You Need", as a command-line toolkit and a
Python API (`from nmt_cli import Translator`)."""

from typing import TYPE_CHECKING, Any

from nmt_cli.errors import NmtError
from nmt_cli.version import __version__

if TYPE_CHECKING:  # what type checkers see; at run time, imported when first asked for
    from nmt_cli.decode.records import Scored, Translation
    from nmt_cli.decode.translator import LoadOptions, SearchOptions, Translator

__all__ = ["LoadOptions", "NmtError", "Scored", "SearchOptions", "Translation", "Translator", "__version__"]


def __getattr__(name: str) -> Any:
    """`Translator` and its results are imported when first asked for: `nmt --help` and `nmt
    preprocess` never load torch."""
    if name in ("Translator", "SearchOptions", "LoadOptions"):
        from nmt_cli.decode import translator

        return getattr(translator, name)
    if name in ("Scored", "Translation"):
        from nmt_cli.decode import records

        return getattr(records, name)
    raise AttributeError(f"module 'nmt_cli' has no attribute {name!r}")
