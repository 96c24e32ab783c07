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
from nmt_cli.serve.libretranslate import parse_libretranslate
from nmt_cli.serve.schemas import BadRequest

LIMITS = ServeConfig(max_beam=4, max_sentences=2, max_chars=4)


@pytest.mark.parametrize("body, reason", [
    ({"q": "a", "texte": 1}, "unknown field 'texte' (LibreTranslate's: q, source, target, format, alternatives, "
                             "api_key)"),
    ({"q": 3}, "q: a text or a list of texts"),
    ({"q": ["a", None]}, "q: a text or a list of texts"),
    ({"q": "a", "format": "html"}, "format 'html': only text is translated here"),
    ({"q": "a", "format": "pdf"}, "format 'pdf': only text is translated here"),
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
