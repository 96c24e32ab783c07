"""`nmt export`: a checkpoint in another runtime's format, one module per format (CTranslate2's,
transformers', ONNX's, the browser page's) or as one safetensors file; each format's module is
imported only when asked for, as each needs its own optional packages."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from nmt_cli.interop.card import CardConfig
from nmt_cli.run_config import ExportConfig


def export_model(model: Path, output: Path, config: ExportConfig, card: CardConfig,
                 evaluations: Sequence[tuple[Path, Path]] = ()) -> str | None:
    """`model` written at `output` in `config.format`; returns a note for the user, if any."""
    from nmt_cli.model.checkpoint import load, load_bundle, save_safetensors

    if config.format == "safetensors":
        save_safetensors(load(model), output)
    elif config.format == "onnx":
        from nmt_cli.interop.export_onnx import save_onnx

        return save_onnx(load_bundle(model), output, config.quantization)
    elif config.format == "web":
        from nmt_cli.interop.export_web import save_web

        save_web(load_bundle(model), output, config.quantization, config.transformers_js)
    elif config.format == "transformers":
        from nmt_cli.interop.card import evaluate
        from nmt_cli.interop.export_transformers import save_transformers

        save_transformers(load(model), model, output, card, [evaluate(model, *pair) for pair in evaluations])
    else:
        from nmt_cli.decode.shortlist import Shortlist
        from nmt_cli.interop.export_ctranslate2 import save_ctranslate2

        bundle = load_bundle(model)
        save_ctranslate2(bundle, output, config.quantization,
                         config.shortlist and Shortlist.load(config.shortlist, bundle))
    return None
