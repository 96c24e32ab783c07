"""`nmt export`: a checkpoint in another runtime's format, by the writer formats.py's table names
for it (its module imported only when asked for, as each needs its own optional packages), or as
one safetensors file."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nmt_cli.interop.card import CardConfig
from nmt_cli.interop.formats import WRITERS
from nmt_cli.run_config import ExportConfig


@dataclass(frozen=True)
class ExportRequest:
    """What a writer is asked: the checkpoint at `model` written at `output` as `config` says, with
    the model card's settings and the (source, reference) pairs it scores (transformers')."""

    model: Path
    output: Path
    config: ExportConfig
    card: CardConfig = CardConfig()
    evaluations: Sequence[tuple[Path, Path]] = ()


def export_model(model: Path, output: Path, config: ExportConfig, card: CardConfig,
                 evaluations: Sequence[tuple[Path, Path]] = ()) -> str | None:
    """`model` written at `output` in `config.format`; returns a note for the user, if any."""
    return WRITERS[config.format].entry()(ExportRequest(model, output, config, card, evaluations))


def export(request: ExportRequest) -> None:
    """`nmt export --format safetensors`: the checkpoint as one safetensors file."""
    from nmt_cli.model.checkpoint import load, save_safetensors

    save_safetensors(load(request.model), request.output)
