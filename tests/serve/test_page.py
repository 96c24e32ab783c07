"""The page of `nmt serve` (GET /) in a real browser: headless Chromium (Debian's package) driven by
Playwright types a sentence, presses Ctrl+Enter and reads back the translation the API gives;
with keys, the page asks for one. Skipped, with the reason, only where Chromium or Playwright is
missing (.ci/run installs Chromium)."""

import json
import re
import shutil
import signal
import urllib.request

import pytest
from conftest import serving

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (the dev extra has it)")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


def authorized(url: str, lines: list[str], key: str) -> list[str]:
    """The API's translations of `lines`."""
    data = json.dumps({"text": lines}).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    with urllib.request.urlopen(urllib.request.Request(url + "/translate", data=data, headers=headers)) as answer:
        return json.loads(answer.read())["translations"]


@pytest.mark.slow
def test_the_page_translates_what_is_typed_as_the_api_does(browser, tmp_path):
    (tmp_path / "keys.txt").write_text("secret\n")
    _, url, process = serving(tmp_path, "--api-keys", tmp_path / "keys.txt")
    page = browser.new_page(viewport={"width": 390, "height": 740})  # a phone's
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(url + "/")
    page.fill("#source", "a b c\nd e")
    page.keyboard.press("Control+Enter")
    sync_api.expect(page.locator("#status")).to_contain_text("API key")  # 401: the page asks for a key
    assert page.locator("#keybox").is_visible()
    page.fill("#key", "secret")
    page.click("#go")
    sync_api.expect(page.locator("#status")).to_have_text(re.compile(r"^\d+ ms$"), timeout=10000)
    assert page.locator("#target").inner_text().split("\n") == authorized(url, ["a b c", "d e"], "secret")
    page.check("#more")
    page.click("#go")
    sync_api.expect(page.locator("#alternatives li").first).to_be_visible(timeout=10000)
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390 and not errors, (width, errors)  # no sideways scrolling on a phone, no script error
    page.close()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0
