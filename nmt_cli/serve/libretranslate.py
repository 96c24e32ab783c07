"""LibreTranslate's API beside nmt-cli's own, so that its clients (browser extensions, SearXNG,
Mastodon's translation feature, libretranslatepy) can use `nmt serve`: `POST /translate` with `q`
(a string or a list; JSON or a form), `source` ("auto" where one pair fits), `target`, `format`
(text or html), `alternatives`, `api_key` -> `{"translatedText": ..., "alternatives": ...}`, and
`POST /detect` (`q`) -> the served source languages (there is no language detector: one source
language is it, with confidence 100); errors as `{"error": ...}`. A text of several lines is
translated line by line, its lines kept; html's text between tags is translated, its tags and
attributes kept as they are (and what script and style elements hold), as LibreTranslate does.
"""

import functools
import html
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any

from nmt_cli.decode.records import Translation
from nmt_cli.run_config import ServeConfig
from nmt_cli.serve.schemas import BadRequest, check_lines

FIELDS = ("q", "source", "target", "format", "alternatives", "api_key")


def is_libretranslate(body: Any) -> bool:
    """Whether a /translate body is LibreTranslate's (it has `q`; ours has `text`)."""
    return isinstance(body, dict) and "q" in body


RAW_TEXT = ("script", "style")  # elements whose content is not text to translate
SPACES = re.compile(r"^(\s*)(.*?)(\s*)$", re.S)

Piece = tuple[str, bool]  # a part of a text, and whether it is a line to translate


def text_pieces(text: str) -> list[Piece]:
    """A text format `q`: each of its lines to translate, the line breaks kept."""
    pieces: list[Piece] = []
    for k, line in enumerate(text.split("\n")):
        pieces += [("\n", False)] * (k > 0) + [(line, True)]
    return pieces


class Markup(HTMLParser):
    """Where each part of an html text begins, by Python's HTML parser (a `>` inside a quoted
    attribute stays in its tag, a `<` that opens no tag is text): `parts`, each (start, what):
    "text", ("start", tag), ("end", tag) or "markup" (a comment, a declaration)."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.parts: list[tuple[int, Any]] = []
        self.feed(text)
        self.close()

    def _at(self, what: Any) -> None:
        line, column = self.getpos()
        start = self.line_starts[line - 1] + column
        if not (what == "text" and self.parts and self.parts[-1][1] == "text"):  # text in several calls: one part
            self.parts.append((start, what))

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        self._at(("start", tag))

    def handle_endtag(self, tag: str) -> None:
        self._at(("end", tag))

    def handle_startendtag(self, tag: str, attrs: Any) -> None:
        self._at("markup")

    def handle_data(self, data: str) -> None:
        self._at("text")

    def handle_comment(self, data: str) -> None:
        self._at("markup")

    handle_decl = handle_pi = unknown_decl = handle_comment


def html_pieces(text: str) -> list[Piece]:
    """An html `q`: the text between tags to translate (entities read, whitespace around it and
    inside it kept as one space), tags, comments, script and style as they are."""
    parts = Markup(text).parts
    pieces: list[Piece] = [(text[:parts[0][0]], False)] if parts and parts[0][0] else []
    inside: str | None = None  # script or style, until it closes
    for (start, what), (end, _) in zip(parts, parts[1:] + [(len(text), None)]):
        part = text[start:end]
        if what != "text":
            if inside is None and what[0] == "start" and what[1] in RAW_TEXT:
                inside = what[1]
            elif what == ("end", inside):
                inside = None
            pieces.append((part, False))
        elif inside or not part.strip():
            pieces.append((part, False))
        else:
            before, words, after = SPACES.match(part).groups()  # type: ignore[union-attr]
            pieces += [(before, False), (" ".join(html.unescape(words).split()), True), (after, False)]
    return pieces


@dataclass
class LibreRequest:
    texts: list[str]
    single: bool  # `q` was one string: so is the answer
    source: str | None
    target: str | None
    alternatives: int
    html: bool = False

    @functools.cached_property
    def pieces(self) -> list[list[Piece]]:
        return [(html_pieces if self.html else text_pieces)(text) for text in self.texts]

    @functools.cached_property
    def lines(self) -> list[str]:
        """The sentences to translate: every line of every text (html: its text between tags)."""
        return [piece for pieces in self.pieces for piece, translated in pieces if translated]

    def rebuilt(self, translations: list[str]) -> list[str]:
        """Each text with its lines (`translations`, in the order of `lines`) in their places."""
        given = iter(html.escape(t, quote=False) if self.html else t for t in translations)
        return ["".join(next(given) if translated else piece for piece, translated in pieces)
                for pieces in self.pieces]

    def options(self, beam: int) -> dict[str, Any]:
        """The search options: with alternatives, that many more hypotheses (the beam at least as wide)."""
        wanted = self.alternatives + 1
        return {"nbest": wanted, "beam": max(beam, wanted)} if self.alternatives else {}

    def answer(self, found: list[list[Translation]], source: str) -> dict[str, Any]:
        """LibreTranslate's answer from each line's translations, best first (`source`: the
        language translated from)."""
        choices = [self.rebuilt([hyps[k].text if k < len(hyps) else "" for hyps in found])
                   for k in range(self.alternatives + 1)]  # the best, then each alternative
        answer: dict[str, Any] = {"translatedText": choices[0][0] if self.single else choices[0]}
        if self.alternatives:
            alternatives = [[choice[t] for choice in choices[1:]] for t in range(len(self.texts))]
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
    if body.get("format", "text") not in ("text", "html"):
        raise BadRequest(400, f"format {body['format']!r}: text or html")
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
                         alternatives, body.get("format") == "html")
    if len(asked.lines) > config.max_sentences:
        raise BadRequest(413, f"{len(asked.lines)} lines, more than the server's --max-sentences "
                              f"{config.max_sentences}")
    check_lines(asked.lines, config, "line")
    return asked


def detected(body: Any, sources: list[str]) -> list[dict[str, Any]]:
    """LibreTranslate's /detect answer: the server has no language detector, so the languages it
    translates from, equally likely (one: it, with confidence 100)."""
    if not isinstance(body, dict) or not isinstance(body.get("q"), str):
        raise BadRequest(400, 'the body must hold "q": the text whose language to detect')
    unknown = sorted(set(body) - {"q", "api_key"})
    if unknown:
        raise BadRequest(400, f"unknown field {unknown[0]!r} (LibreTranslate's /detect: q, api_key)")
    return [{"confidence": round(100.0 / len(sources), 1), "language": language} for language in sources]
