"""`nmt export --format web`: the page, served by a local static server, loads in headless Chromium
(Debian's package, driven by Playwright), translates three typed lines as `nmt translate --beam 1`
does, sends no request beyond 127.0.0.1 and logs no error; what it cannot serve is refused in one line."""

import functools
import http.server
import re
import shutil
import threading

import pytest
from conftest import cli, tiny_checkpoint, tiny_sentencepiece_checkpoint

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.mark.slow
@pytest.mark.parametrize("exported", ["shared"], indirect=True)
def test_the_page_translates_in_the_browser_as_nmt_does(exported, transformers_js, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (the dev extra has it)")
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    tmp, _, sources = exported
    model, lines = tmp / "ck/checkpoint_last.pt", sources[:3]
    result = cli("export", "-m", model, "--format", "web", "-o", tmp_path / "web", "--transformers-js",
                 transformers_js.parents[1])
    assert result.exit_code == 0, result.output
    graphs = sorted(graph.name for graph in (tmp_path / "web/model/onnx").iterdir())
    assert graphs == ["decoder_model_merged.onnx", "encoder_model.onnx"]  # what the page loads, no more
    expected = cli("translate", "-m", model, "--beam", 1, input="\n".join(lines) + "\n").stdout.splitlines()
    handler = functools.partial(Quiet, directory=str(tmp_path / "web"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{server.server_address[1]}/"
    requests, errors = [], []
    try:
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page()
            page.on("request", lambda request: requests.append(request.url))
            page.on("console", lambda message: message.type == "error" and errors.append(message.text))
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(origin)
            sync_api.expect(page.locator("#go")).to_be_enabled(timeout=60000)  # the model loaded
            page.fill("#source", "\n".join(lines))
            page.keyboard.press("Control+Enter")
            sync_api.expect(page.locator("#status")).to_have_text(re.compile(r"^\d+ ms$"), timeout=60000)
            found = page.locator("#target").inner_text().split("\n")
            browser.close()
    finally:
        server.shutdown()
    assert found == expected
    assert [url for url in requests if re.match(r"(https?|wss?):", url) and not url.startswith(origin)] == []
    assert errors == []


def test_the_page_needs_a_model_javascript_can_tokenize_and_transformers_js(tmp_path, monkeypatch):
    monkeypatch.delenv("NMT_TRANSFORMERS_JS", raising=False)
    words = cli("export", "-m", tiny_checkpoint(tmp_path / "words.pt"), "--format", "web", "-o", tmp_path / "web")
    assert words.exit_code != 0 and "cannot translate in a browser" in words.output
    assert "--subword sentencepiece" in words.output and len(words.output.strip().splitlines()) == 1
    pieces = cli("export", "-m", tiny_sentencepiece_checkpoint(tmp_path / "pieces.pt"), "--format", "web", "-o",
                 tmp_path / "web")
    assert pieces.exit_code != 0 and "npm install --ignore-scripts @huggingface/transformers@" in pieces.output
    assert len(pieces.output.strip().splitlines()) == 1 and not (tmp_path / "web").exists()

