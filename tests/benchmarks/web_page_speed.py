"""The browser page's speed: `python tests/benchmarks/web_page_speed.py -m CKPT --transformers-js DIR [--int8]`.

Exports the checkpoint as `nmt export --format web [--quantize int8]` does, serves the folder
from 127.0.0.1, opens it in headless Chromium (Playwright; `--chromium`, default Debian's), and
measures the time from opening the page to the model being loaded, then to the first line of the
input (Multi30k test_2016_flickr.en) being translated, and the page's sentences/s over its first
`--lines` lines (greedy, a line at a time, one WebAssembly thread as a static server allows). Prints
one JSON line with those, the BLEU of the page's lines and how many equal `nmt translate --beam 1`'s.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import sacrebleu
import torch
from common import SHARED
from playwright.sync_api import expect, sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/conftest.py's static_server
from conftest import static_server  # noqa: E402

from nmt_cli.config import SearchConfig
from nmt_cli.decode.engine import Engine
from nmt_cli.interop.export_web import save_web
from nmt_cli.model.checkpoint import load_bundle
from nmt_cli.run_config import RunConfig


def translate(page, lines: list[str]) -> float:
    """Seconds the page took to translate `lines` (its status line's figure)."""
    page.fill("#source", "\n".join(lines))
    page.click("#go")
    expect(page.locator("#status")).to_have_text(re.compile(r"^\d+ ms$"), timeout=3_600_000)
    status = page.locator("#status").inner_text()
    page.evaluate("document.getElementById('status').textContent = ''")  # the next call waits for its own
    return int(status.split()[0]) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-m", "--model", type=Path, required=True)
    parser.add_argument("--transformers-js", type=Path, required=True, help="node_modules/@huggingface/transformers")
    parser.add_argument("-i", "--input", type=Path, default=SHARED / "multi30k" / "test_2016_flickr.en")
    parser.add_argument("--ref", type=Path, default=SHARED / "multi30k" / "test_2016_flickr.de")
    parser.add_argument("--lines", type=int, default=100)
    parser.add_argument("--int8", action="store_true")
    parser.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    args = parser.parse_args()
    lines = args.input.read_text(encoding="utf-8").splitlines()[:args.lines]
    refs = args.ref.read_text(encoding="utf-8").splitlines()[:args.lines]
    bundle = load_bundle(args.model)
    engine = Engine([bundle], RunConfig(SearchConfig(beam=1)), torch.device("cpu"))
    sources = [engine.pipeline.source_ids(line, n) for n, line in enumerate(lines, 1)]
    ours = [engine.pipeline.text(h[0].tokens) for h in engine.generator.search(sources, engine.config.search)]
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work) / "web"
        save_web(bundle, folder, "int8" if args.int8 else "float32", args.transformers_js)
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        with static_server(folder) as origin, sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
            page = browser.new_page()
            start = time.perf_counter()
            page.goto(origin)
            expect(page.locator("#go")).to_be_enabled(timeout=300_000)
            loaded = time.perf_counter() - start
            first = translate(page, lines[:1])  # the time to a first translation: loading, then one line
            seconds = translate(page, lines)
            found = page.locator("#target").inner_text().split("\n")
            browser.close()
    print(json.dumps({"benchmark": "web_page_speed", "model": str(args.model), "int8": args.int8,
                      "lines": len(lines), "folder_mb": round(size / 1e6, 1), "load_s": round(loaded, 2),
                      "first_line_s": round(first, 2), "first_translation_s": round(loaded + first, 2),
                      "sentences_per_s": round(len(lines) / seconds, 1),
                      "bleu": round(sacrebleu.corpus_bleu(found, [refs]).score, 2),
                      "lines_equal_to_nmt": sum(a == b for a, b in zip(found, ours))}))


if __name__ == "__main__":
    main()
