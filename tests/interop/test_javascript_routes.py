"""The JavaScript routes: transformers.js in Node (`pipeline('translation')`, local files only)
translates the `nmt export --format onnx` folder of a trained SentencePiece model as `nmt translate
--beam 1` does, and its int8 graphs (dtype q8) mostly as the float32 ones; the page of `--format
web`, served by a local static server, loads in headless Chromium (Debian's package, driven by
Playwright), translates three typed lines as `nmt translate --beam 1` does, sends no request
beyond 127.0.0.1 and logs no error. A model whose text JavaScript cannot tokenize is exported for
onnxruntime alone, with a one-line note that says why and what to train instead, and refused for
the page in one line, as the page is without transformers.js. The two routes share one trained
model (one module: one worker trains it)."""

import re
import shutil

import pytest
from conftest import cli, run_transformers_js, static_server, tiny_checkpoint, tiny_sentencepiece_checkpoint

from nmt_cli.interop.export_web import TRANSFORMERS_JS, VENDORED

pytest.importorskip("onnxscript")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
LIMIT = 20  # output tokens: `nmt translate --max-len-b` and transformers.js's max_new_tokens (its forced </s> one more)


@pytest.mark.slow
@pytest.mark.parametrize("exported", ["shared"], indirect=True)
def test_transformers_js_translates_as_nmt_does(exported, transformers_js, tmp_path):
    tmp, _, sources = exported
    model = tmp / "ck/checkpoint_last.pt"
    result = cli("export", "-m", model, "--format", "onnx", "--quantize", "int8", "-o", tmp_path / "onnx")
    assert result.exit_code == 0 and "note" not in result.output, result.output
    found = run_transformers_js(transformers_js, tmp_path / "onnx", sources, max_new_tokens=LIMIT + 1)
    result = cli("translate", "-m", model, "--beam", 1, "--max-len-a", 0, "--max-len-b", LIMIT, "--at-limit", "free",
                 input="\n".join(sources) + "\n")
    assert result.exit_code == 0, result.output
    assert found["translations"] == result.stdout.splitlines()
    int8 = run_transformers_js(transformers_js, tmp_path / "onnx", sources, dtype="q8", max_new_tokens=LIMIT + 1)
    same = sum(a == b for a, b in zip(int8["translations"], found["translations"]))
    assert same >= 3 * len(sources) // 4  # int8 is lossy, yet mostly the same (37 of 40 when written)


def test_a_model_of_words_exports_for_onnxruntime_with_a_note(tmp_path, monkeypatch):
    from nmt_cli.interop import export_onnx

    monkeypatch.setattr(export_onnx, "export_graphs", lambda model, out: None)  # the graphs: tests above
    result = cli("export", "-m", tiny_checkpoint(tmp_path / "words.pt"), "--format", "onnx", "-o", tmp_path / "onnx")
    assert result.exit_code == 0, result.output
    (note,) = [line for line in result.output.splitlines() if line.startswith("note:")]
    assert "not transformers.js" in note and "--subword sentencepiece" in note
    assert not (tmp_path / "onnx/tokenizer.json").exists() and (tmp_path / "onnx/nmt-cli.json").exists()


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
    requests, errors = [], []
    with static_server(tmp_path / "web") as origin, sync_api.sync_playwright() as playwright:
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
    empty = cli("export", "-m", tmp_path / "pieces.pt", "--format", "web", "-o", tmp_path / "web", "--transformers-js",
                tmp_path)
    assert empty.exit_code != 0 and "transformers.min.js is missing" in empty.output
    package = tmp_path / "node_modules/@huggingface/transformers"  # an npm install of another version
    for folder, files in ((package, VENDORED["transformers"]), (tmp_path / "node_modules/onnxruntime-web",
                                                              VENDORED["onnxruntime-web"])):
        for name in files:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text('{"version": "0.0.1"}')
    monkeypatch.setenv("NMT_TRANSFORMERS_JS", str(package))
    other = cli("export", "-m", tmp_path / "pieces.pt", "--format", "web", "-o", tmp_path / "web")
    assert other.exit_code != 0 and f"transformers.js 0.0.1, and the page is made for {TRANSFORMERS_JS}" in other.output
    assert len(other.output.strip().splitlines()) == 1 and not (tmp_path / "web").exists()
    (package / "package.json").write_text('{"name": "@huggingface/transformers", "vers')  # cut short
    cut = cli("export", "-m", tmp_path / "pieces.pt", "--format", "web", "-o", tmp_path / "web")
    assert cut.exit_code == 1 and "no version in its package.json, and the page is made for" in cut.output
    assert len(cut.output.strip().splitlines()) == 1 and "Traceback" not in cut.output

