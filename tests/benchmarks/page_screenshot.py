"""The README's picture of `nmt serve`'s page: `python tests/benchmarks/page_screenshot.py -m CKPT -o
docs/serve-page.png` starts the server, types two test_2016_flickr sentences into the page in
headless Chromium (Playwright), translates them with alternatives, and saves the screenshot."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from common import SHARED
from playwright.sync_api import expect, sync_playwright
from serve_load import serving


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-m", "--model", type=Path, required=True)
    parser.add_argument("-i", "--input", type=Path, default=SHARED / "multi30k" / "test_2016_flickr.en")
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    args.batch_window_ms = 5.0
    lines = args.input.read_text(encoding="utf-8").splitlines()[:2]
    with serving(args) as url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 900, "height": 420})
        page.goto(url + "/")
        page.fill("#source", "\n".join(lines))
        page.check("#more")
        page.click("#go")
        expect(page.locator("#alternatives li").first).to_be_visible(timeout=60000)
        page.screenshot(path=str(args.output))
        browser.close()
    print(args.output)


if __name__ == "__main__":
    main()
