"""Table 3 of the paper: its rows as overrides of the base model, with the parameter counts it
reports, so that `nmt info` can name the row an architecture is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nmt_cli.config import PRESETS, ModelConfig


@dataclass(frozen=True)
class PaperRow:
    """A Table 3 row with a parameter count (millions), relative to the base model."""

    name: str
    overrides: dict[str, Any]
    params_m: float


TABLE3: tuple[PaperRow, ...] = (
    PaperRow("base", {}, 65),
    PaperRow("(B) d_k=16", {"d_k": 16}, 58),
    PaperRow("(B) d_k=32", {"d_k": 32}, 60),
    PaperRow("(C) N=2", {"encoder_layers": 2, "decoder_layers": 2}, 36),
    PaperRow("(C) N=4", {"encoder_layers": 4, "decoder_layers": 4}, 50),
    PaperRow("(C) N=8", {"encoder_layers": 8, "decoder_layers": 8}, 80),
    PaperRow("(C) d_model=256", {"d_model": 256, "d_k": 32, "d_v": 32}, 28),
    PaperRow("(C) d_model=1024", {"d_model": 1024, "d_k": 128, "d_v": 128}, 168),
    PaperRow("(C) d_ff=1024", {"d_ff": 1024}, 53),
    PaperRow("(C) d_ff=4096", {"d_ff": 4096}, 90),
    PaperRow("big", {"d_model": 1024, "d_ff": 4096, "heads": 16, "dropout": 0.3}, 213),
)

ARCHITECTURE_FIELDS = (
    "encoder_layers", "decoder_layers", "d_model", "d_ff", "heads", "d_k", "d_v", "positions", "norm",
)


def paper_row(config: ModelConfig) -> PaperRow | None:
    """The Table 3 row whose architecture (not its dropout) equals `config`, if any."""
    def shape(c: ModelConfig) -> tuple:
        return tuple(getattr(c, name) for name in ARCHITECTURE_FIELDS)

    for row in TABLE3:
        if shape(PRESETS["base"].replace(**row.overrides)) == shape(config):
            return row
    return None
