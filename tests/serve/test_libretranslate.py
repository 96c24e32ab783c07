"""LibreTranslate's API (libretranslate.py): its requests checked in one line, its answers shaped
as LibreTranslate's; and a server of two language pairs used by an unmodified LibreTranslate
client (libretranslatepy), beside nmt-cli's own API."""

import json
import signal
import urllib.error
import urllib.request

import pytest
from conftest import serving, tiny_checkpoint
from libretranslatepy import LibreTranslateAPI

from nmt_cli.decode.records import Translation
from nmt_cli.run_config import ServeConfig
from nmt_cli.serve.libretranslate import detected, parse_libretranslate
from nmt_cli.serve.schemas import BadRequest

LIMITS = ServeConfig(max_beam=4, max_sentences=2, max_chars=4)


@pytest.mark.parametrize("body, reason", [
    ({"q": "a", "texte": 1}, "unknown field 'texte' (LibreTranslate's: q, source, target, format, alternatives, "
                             "api_key)"),
    ({"q": 3}, "q: a text or a list of texts"),
    ({"q": ["a", None]}, "q: a text or a list of texts"),
    ({"q": "a", "format": "pdf"}, "format 'pdf': text or html"),
    ({"q": "a", "target": 7}, "target: a language code, such as en"),
    ({"q": "a", "alternatives": "many"}, "alternatives: a number from 0 to 3 (the server's --max-beam, less one)"),
    ({"q": "a", "alternatives": 4}, "alternatives: a number from 0 to 3 (the server's --max-beam, less one)"),
    ({"q": "a\nb\nc"}, "3 lines, more than the server's --max-sentences 2"),
    ({"q": ["a", "bcdef"]}, "line 2: 5 characters, more than the server's --max-chars 4"),
])
def test_a_bad_request_is_refused_in_one_line(body, reason):
    with pytest.raises(BadRequest, match=f"^{reason}$".replace("(", r"\(").replace(")", r"\)")):
        parse_libretranslate(body, LIMITS)


def test_answers_keep_the_lines_of_each_text_and_the_shape_of_q():
    asked = parse_libretranslate({"q": ["a\nb", "c"], "source": "auto", "alternatives": "1"}, ServeConfig(max_beam=4))
    assert asked.lines == ["a", "b", "c"] and asked.options(beam=1) == {"nbest": 2, "beam": 2}

    def hyps(*texts: str) -> list[Translation]:
        return [Translation(text, [], 0.0, 0.0) for text in texts]

    answer = asked.answer([hyps("A", "A2"), hyps("B"), hyps("C", "C2")], "en")
    assert answer == {"translatedText": ["A\nB", "C"], "alternatives": [["A2\n"], ["C2"]],
                      "detectedLanguage": {"confidence": 100.0, "language": "en"}}
    single = parse_libretranslate({"q": "a", "source": "en"}, LIMITS)
    assert single.answer([hyps("A")], "en") == {"translatedText": "A"}


def test_html_is_translated_between_its_tags_which_stay_as_they_are():
    """As LibreTranslate: tags and attributes kept, entities read and written back, what script
    and style hold left alone, the whitespace around a text kept."""
    page = '<p title="A b">a &amp; b</p>\n<script>x = "c d";</script><i> e  f </i><!-- g -->'
    asked = parse_libretranslate({"q": page, "format": "html"}, ServeConfig())
    assert asked.lines == ["a & b", "e f"]
    answer = asked.answer([[Translation("A < B", [], 0.0, 0.0)], [Translation("E F", [], 0.0, 0.0)]], "en")
    assert answer == {"translatedText": page.replace("a &amp; b", "A &lt; B").replace(" e  f ", " E F ")}
    # a `>` inside a quoted attribute is the attribute's, a `<` that opens no tag is text, and
    # what a script holds stays, a closing tag of another element inside it too
    page = "<a href='/x?a>b' title=\"c>d\">g h</a> 1 < 2 > 0<script>s = '</p>';</script>\n<b>i</b>"
    asked = parse_libretranslate({"q": page, "format": "html"}, ServeConfig())
    assert asked.lines == ["g h", "1 < 2 > 0", "i"]
    answer = asked.answer([[Translation(t, [], 0.0, 0.0)] for t in ("G H", "1 < 2", "I")], "en")
    assert answer == {"translatedText": page.replace("g h", "G H").replace(" 1 < 2 > 0", " 1 &lt; 2")
                      .replace(">i<", ">I<")}


def test_detection_names_the_languages_translated_from():
    assert detected({"q": "a b"}, ["en"]) == [{"confidence": 100.0, "language": "en"}]
    assert detected({"q": "a b", "api_key": "k"}, ["de", "en"]) == [{"confidence": 50.0, "language": "de"},
                                                                    {"confidence": 50.0, "language": "en"}]
    for body, reason in (({"text": "a"}, 'the body must hold "q"'), ({"q": "a", "source": "en"}, "unknown field")):
        with pytest.raises(BadRequest, match=reason):
            detected(body, ["en"])


@pytest.mark.slow
def test_detect_html_and_int8_through_a_client_and_curl(tmp_path):
    """libretranslatepy's detect, curl's html form, int8 as `nmt translate --quantize int8` runs
    it, and /metrics behind --metrics-key."""
    import subprocess

    from conftest import cli, request

    (tmp_path / "keys.txt").write_text("k\n")
    (tmp_path / "metrics-keys.txt").write_text("m\n")
    model = tiny_checkpoint(tmp_path / "m.pt", seed=1)
    _, url, process = serving(tmp_path, "--api-keys", tmp_path / "keys.txt", "--quantize", "int8", "--metrics-key",
                              tmp_path / "metrics-keys.txt", "--failed-key-limit", 3, model=f"en-de={model}")
    assert LibreTranslateAPI(url, api_key="k").detect("a b") == [{"confidence": 100.0, "language": "en"}]
    lines = ["a b c", "d e"]
    answer = authorized(url, {"text": lines, "nbest": 2, "beam": 2}, {"Authorization": "Bearer k"})
    scores = [[hyp["score"] for hyp in nbest] for nbest in answer["nbest"]]
    for quantize, same in (("int8", True), (None, False)):  # int8's scores, not fp32's
        flags = ["--quantize", quantize] if quantize else []
        run = cli("translate", "-m", model, *flags, "--device", "cpu", "--format", "jsonl", "--nbest", 2, "--beam", 2,
                  input="\n".join(lines) + "\n")
        records = [json.loads(line) for line in run.stdout.splitlines()]
        assert ([[hyp["score"] for hyp in r["nbest"]] for r in records] == scores) is same
        assert [r["translation"] for r in records] == answer["translations"] or not same
    ours = authorized(url, {"text": lines}, {"Authorization": "Bearer k"})["translations"]
    answer = json.loads(subprocess.run(
        ["curl", "-s", url + "/translate", "-d", "q=<p class='x'>a b c</p> <b>d e</b>", "-d", "format=html",
         "-d", "source=en", "-d", "target=de", "-d", "api_key=k"], capture_output=True, text=True, timeout=60).stdout)
    assert answer == {"translatedText": f"<p class='x'>{ours[0]}</p> <b>{ours[1]}</b>"}
    assert request(url + "/health")[0] == 200
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url + "/metrics", timeout=60)
    assert refused.value.code == 401
    scraped = urllib.request.Request(url + "/metrics", headers={"Authorization": "Bearer m"})
    assert urllib.request.urlopen(scraped, timeout=60).status == 200
    codes = []
    for guess in ("a", "b", "m"):  # with the refusal above, 3 wrong guesses: then even the key waits
        try:
            codes.append(urllib.request.urlopen(urllib.request.Request(
                url + "/metrics", headers={"Authorization": f"Bearer {guess}"}), timeout=60).status)
        except urllib.error.HTTPError as e:
            codes.append(e.code)
    assert codes == [401, 401, 429]
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0


@pytest.mark.slow
def test_a_libretranslate_client_uses_a_server_of_two_pairs(tmp_path):
    (tmp_path / "keys.txt").write_text("k\n")
    forward, backward = tiny_checkpoint(tmp_path / "f.pt", seed=1), tiny_checkpoint(tmp_path / "b.pt", seed=2)
    _, url, process = serving(tmp_path, "--api-keys", tmp_path / "keys.txt", "--model", f"de-en={backward}",
                              model=f"en-de={forward}")
    client = LibreTranslateAPI(url, api_key="k")
    assert client.languages() == [{"code": "en", "name": "en", "targets": ["de"]},
                                  {"code": "de", "name": "de", "targets": ["en"]}]
    headers = {"Authorization": "Bearer k"}
    ours = {pair: authorized(url, {"text": ["a b c", "d e"], "source": pair[0], "target": pair[1]}, headers)
            for pair in [("en", "de"), ("de", "en")]}
    assert ours[("en", "de")] != ours[("de", "en")]  # two models
    assert client.translate("a b c\nd e", "en", "de") == "\n".join(ours[("en", "de")]["translations"])
    assert client.translate("a b c\nd e", "auto", "en") == "\n".join(ours[("de", "en")]["translations"])
    with pytest.raises(urllib.error.HTTPError) as refused:
        LibreTranslateAPI(url, api_key="wrong").translate("a b", "en", "de")
    assert refused.value.code == 401
    status, answer = authorized(url, {"q": "a b", "source": "fr", "target": "de"}, headers, status=True)
    assert status == 400 and answer == {"error": "no model for fr-de (this server translates en-de, de-en)"}
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0


def authorized(url: str, body: dict, headers: dict, status: bool = False):
    """The answer (with `status`: and its status) to a POST /translate with `headers`."""
    data = json.dumps(body).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url + "/translate", data=data, headers=headers),
                                    timeout=60) as answer:
            code, result = answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as e:
        code, result = e.code, json.loads(e.read())
    return (code, result) if status else result
