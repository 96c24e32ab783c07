"""`nmt export --format web`: a static folder that translates typed text in a browser tab, with no
server behind it and nothing fetched from elsewhere:

- `index.html`, the page (web.html): transformers.js's translation pipeline, greedy, a line at a time,
  within nmt's length limit (`length_limit`);
- `model/`, the ONNX export (export_onnx.py) with the two graphs the page loads
  (`onnx/encoder_model.onnx`, `onnx/decoder_model_merged.onnx`, or their int8 copies with
  `--quantize int8`) and its tokenizer.json;
- `vendor/`, transformers.js's browser bundle and onnxruntime-web's WebAssembly build, copied from
  an npm install of transformers.js (`--transformers-js`, or $NMT_TRANSFORMERS_JS), with their
  licences and versions.

Any static server serves it (`python -m http.server -d DIR`); a page opened as a file cannot load
modules. Models JavaScript cannot tokenize are refused (tokenizer_json.javascript_refusal).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nmt_cli.config import SearchConfig
from nmt_cli.errors import NmtError
from nmt_cli.files import small_file
from nmt_cli.interop.export_onnx import write_onnx
from nmt_cli.interop.export_transformers import forced_eos
from nmt_cli.interop.tokenizer_json import javascript_refusal
from nmt_cli.interop.writing import write_export
from nmt_cli.model.checkpoint import ModelBundle, load_bundle
from nmt_cli.pages import page

if TYPE_CHECKING:
    from nmt_cli.interop.exporter import ExportRequest

TRANSFORMERS_JS = "4.3.2"  # the version the page is tested with (tests/interop/test_javascript_routes.py)
INSTALL = f"npm install --ignore-scripts @huggingface/transformers@{TRANSFORMERS_JS}"
# What the page takes from each package (onnxruntime-web's JavaScript and WebAssembly of one build),
# and what says its version and licence (onnxruntime-web's, MIT, is in its package.json alone).
VENDORED = {"transformers": ["dist/transformers.min.js", "LICENSE", "package.json"],
            "onnxruntime-web": ["dist/ort-wasm-simd-threaded.jsep.mjs", "dist/ort-wasm-simd-threaded.jsep.wasm",
                                "package.json"]}
# The graphs the page loads (of the precision it runs): transformers.js runs the merged decoder.
LOADED_GRAPHS = ("encoder_model", "decoder_model_merged")


def export(request: ExportRequest) -> None:
    """`nmt export --format web`, with --quantize and --transformers-js."""
    config = request.config
    save_web(load_bundle(request.model), request.output, config.quantization or "float32", config.transformers_js)


def save_web(bundle: ModelBundle, out: Path, quantization: str, transformers_js: Path | None) -> None:
    """The page's folder of `bundle` at `out` (written whole or not at all)."""
    refusal = javascript_refusal(bundle)
    if refusal is not None:
        raise NmtError(f"--format web: this model cannot translate in a browser: {refusal}")
    packages = vendored_packages(transformers_js)

    def write(tmp: Path) -> None:
        (tmp / "model").mkdir()
        write_onnx(bundle, tmp / "model", quantization, tokenizer=True)
        suffix = "_quantized" if quantization == "int8" else ""
        for graph in (tmp / "model" / "onnx").iterdir():
            if graph.stem not in (f"{name}{suffix}" for name in LOADED_GRAPHS):
                graph.unlink()
        (tmp / "vendor").mkdir()
        for package, folder in packages.items():
            for name in VENDORED[package]:
                file = Path(name)
                shutil.copyfile(folder / file, tmp / "vendor" / (file.name if file.parent.name == "dist" else
                                                                 f"{file.stem}.{package}{file.suffix}"))
        settings = {"pair": f"{bundle.text.source_lang} → {bundle.text.target_lang}",
                    "dtype": "q8" if quantization == "int8" else "fp32", "limit": length_limit(bundle)}
        text = json.dumps(settings, ensure_ascii=False).replace("<", "\\u003c")  # nothing in it ends the script
        html = page("nmt_cli.interop", "web.html").replace("SETTINGS", text)
        (tmp / "index.html").write_text(html, encoding="utf-8")

    write_export(out, write)


def length_limit(bundle: ModelBundle) -> dict[str, Any]:
    """What the page needs to stop an output where `nmt translate` does (search.max_lengths): a *
    source tokens + b, within `longest`; whether </s> is forced after it (export_transformers.forced_eos);
    whether the tokenizer's ids of a source end with </s>."""
    search, config = SearchConfig(**bundle.released.search), bundle.model.config
    return {"a": search.max_len_a, "b": search.max_len_b,
            "longest": min(config.max_positions - 1, search.max_len or config.max_positions),
            "forced_eos": forced_eos(search) is not None, "source_eos": config.source_eos}


def vendored_packages(transformers_js: Path | None) -> dict[str, Path]:
    """The folders of transformers.js and of the onnxruntime-web it depends on (npm puts it beside
    transformers.js, or inside it), each holding what VENDORED takes; refused in one line naming
    how to install them."""
    given = transformers_js or (Path(os.environ["NMT_TRANSFORMERS_JS"]) if os.environ.get("NMT_TRANSFORMERS_JS")
                                else None)
    if given is None:
        raise NmtError(f"--format web copies transformers.js into the page: `{INSTALL}`, then give "
                       "--transformers-js node_modules/@huggingface/transformers (or set NMT_TRANSFORMERS_JS)")
    beside, inside = given.parent.parent / "onnxruntime-web", given / "node_modules" / "onnxruntime-web"
    packages = {"transformers": given, "onnxruntime-web": beside if beside.is_dir() else inside}
    for package, folder in packages.items():
        missing = [name for name in VENDORED[package] if not (folder / name).is_file()]
        if missing:
            raise NmtError(f"--transformers-js {given}: {folder / missing[0]} is missing (not an npm install of "
                           f"transformers.js? `{INSTALL}`)")
    try:
        about = json.loads(small_file(given / "package.json", "transformers.js' package.json", 1 << 20))
        version = about.get("version") if isinstance(about, dict) else None
    except (ValueError, UnicodeDecodeError):  # cut short or not JSON: no version to read
        version = None
    if version != TRANSFORMERS_JS:
        found = f"transformers.js {version}" if isinstance(version, str) else "no version in its package.json"
        raise NmtError(f"--transformers-js {given}: {found}, and the page is made for {TRANSFORMERS_JS}: `{INSTALL}`")
    return packages
