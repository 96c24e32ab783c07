"""LibreTranslate's API beside nmt-cli's own, so that its clients (browser extensions, SearXNG,
Mastodon's translation feature, libretranslatepy) can use `nmt serve`: `POST /translate` with `q`
(a string or a list; JSON or a form), `source` ("auto" where one pair fits), `target`, `format`
(text), `alternatives`, `api_key` -> `{"translatedText": ..., "alternatives": ...}`, errors as
`{"error": ...}`. A text of several lines is translated line by line, its lines kept.
"""

import functools
from dataclasses import dataclass
from typing import Any

from nmt_cli.decode.records import Translation
from nmt_cli.run_config import ServeConfig
from nmt_cli.serve.schemas import BadRequest, check_lines

FIELDS = ("q", "source", "target", "format", "alternatives", "api_key")


def is_libretranslate(body: Any) -> bool:
    """Whether a /translate body is LibreTranslate's (it has `q`; ours has `text`)."""
    return isinstance(body, dict) and "q" in body


@dataclass
class LibreRequest:
    texts: list[str]
    single: bool  # `q` was one string: so is the answer
    source: str | None
    target: str | None
    alternatives: int

    @functools.cached_property
    def lines(self) -> list[str]:
        """The sentences to translate: every line of every text."""
        return [line for text in self.texts for line in text.split("\n")]

    def options(self, beam: int) -> dict[str, Any]:
        """The search options: with alternatives, that many more hypotheses (the beam at least as wide)."""
        wanted = self.alternatives + 1
        return {"nbest": wanted, "beam": max(beam, wanted)} if self.alternatives else {}

    def answer(self, found: list[list[Translation]], source: str) -> dict[str, Any]:
        """LibreTranslate's answer from each line's translations, best first (`source`: the
        language translated from)."""
        lines = iter(found)
        per_text = [[next(lines) for _ in text.split("\n")] for text in self.texts]
        translated = ["\n".join(hyps[0].text if hyps else "" for hyps in text) for text in per_text]
        answer: dict[str, Any] = {"translatedText": translated[0] if self.single else translated}
        if self.alternatives:
            alternatives = [["\n".join(hyps[k].text if k < len(hyps) else "" for hyps in text)
                             for k in range(1, self.alternatives + 1)] for text in per_text]
            answer["alternatives"] = alternatives[0] if self.single else alternatives
        if self.source == "auto":
            answer["detectedLanguage"] = {"confidence": 100.0, "language": source}
        return answer


def parse_libretranslate(body: dict[str, Any], config: ServeConfig) -> LibreRequest:
    """A LibreTranslate request, its fields checked (form fields are strings: `alternatives` too)
    and its lines within the server's limits."""
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise BadRequest(400, f"unknown field {unknown[0]!r} (LibreTranslate's: {', '.join(FIELDS)})")
    texts = [body["q"]] if isinstance(body["q"], str) else body["q"]
    if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
        raise BadRequest(400, "q: a text or a list of texts")
    if body.get("format", "text") != "text":
        raise BadRequest(400, f"format {body['format']!r}: only text is translated here")
    for key in ("source", "target"):
        if not isinstance(body.get(key, ""), str):
            raise BadRequest(400, f"{key}: a language code, such as en")
    alternatives = body.get("alternatives", 0)
    if isinstance(alternatives, str) and alternatives.isdigit():
        alternatives = int(alternatives)
    if isinstance(alternatives, bool) or not isinstance(alternatives, int) or not 0 <= alternatives < config.max_beam:
        raise BadRequest(400, f"alternatives: a number from 0 to {config.max_beam - 1} (the server's --max-beam, "
                              "less one)")
    asked = LibreRequest(texts, isinstance(body["q"], str), body.get("source") or None, body.get("target") or None,
                         alternatives)
    if len(asked.lines) > config.max_sentences:
        raise BadRequest(413, f"{len(asked.lines)} lines, more than the server's --max-sentences "
                              f"{config.max_sentences}")
    check_lines(asked.lines, config, "line")
    return asked
