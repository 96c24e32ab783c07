"""The bodies of `nmt serve`'s requests and answers: pydantic models, FastAPI's way (its
/openapi.json and /docs show them), and a request read and checked against the server's limits,
each fault a BadRequest of one line. A request's search options are SearchConfig's own fields
(config.py), with their help, type and range, so an option is declared once for flags, the
Python API and requests.
"""

import json
import typing
from dataclasses import asdict
from typing import Any, Literal
from urllib.parse import parse_qs

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from nmt_cli.config import SearchConfig
from nmt_cli.options import check_applies
from nmt_cli.run_config import ServeConfig

# SearchConfig's fields that a request may set (the others are the server's: max_len, or not yet served).
REQUEST_OPTIONS = ("beam", "nbest", "lenpen", "lenpen_form", "lenpen_start", "stopping", "at_limit", "max_len_a",
                   "max_len_b", "allow_unk", "min_len", "no_repeat_ngram_size", "repetition_penalty", "plain_first",
                   "sampling", "sampling_topk", "sampling_topp", "temperature", "seed", "mbr", "mbr_utility",
                   "mbr_candidates")
HINTS = typing.get_type_hints(SearchConfig)  # the annotations are strings (`from __future__ import annotations`)


def option(name: str) -> tuple[Any, Any]:
    """The pydantic field of SearchConfig's `name`: optional (the server's default), its knob's
    help, choices and range."""
    meta = SearchConfig.__dataclass_fields__[name].metadata
    kind = Literal[tuple(meta["choices"])] if "choices" in meta else HINTS[name]
    bounds = {}
    if "min" in meta:
        bounds["gt" if meta.get("exclusive_min") else "ge"] = meta["min"]
    if "max" in meta:
        bounds["lt" if meta.get("exclusive_max") else "le"] = meta["max"]
    return kind | None, Field(None, description=meta["help"], **bounds)


TranslateRequest = create_model(
    "TranslateRequest", __config__=ConfigDict(extra="forbid", strict=True, allow_inf_nan=False),
    __doc__="Sentences to translate, one line each, with search options (those not given: the model's).",
    text=(list[str], Field(description="The sentences, one line each.")),
    source=(str | None, Field(None, description="The source language (with several pairs served).")),
    target=(str | None, Field(None, description="The target language (with several pairs served).")),
    prefixes=(list[str] | None, Field(None, description="Each sentence's translation starts with its prefix "
                                                        "(one per sentence; an empty one: none).")),
    attention=(bool | None, Field(None, description="Each best translation's alignment: the cross-attention "
                                                    "of the last decoder layer, heads averaged.")),
    constraints=(list[list[str]] | None, Field(None, description="Each sentence's phrases that its translation "
                                                                "holds, in any order (terminology; beam search).")),
    avoid=(list[list[str]] | None, Field(None, description="Each sentence's phrases that its translation may not "
                                                          "hold (beam search).")),
    **{name: option(name) for name in REQUEST_OPTIONS})


def options(request: Any) -> dict[str, Any]:
    """The search options a request gives."""
    return request.model_dump(exclude_none=True, include=set(REQUEST_OPTIONS))


class Hypothesis(BaseModel):
    text: str = Field(description="The translation.")
    score: float = Field(description="Its log-probability divided by the length penalty: what ranks it.")
    log_prob: float = Field(description="Its log-probability.")


class Alignment(BaseModel):
    layer: int = Field(description="The decoder layer (from 1).")
    src_tokens: list[str] = Field(description="The source subwords, </s> last.")
    tgt_tokens: list[str] = Field(description="The output subwords, </s> last.")
    weights: list[list[float]] = Field(description="Per output token, its attention over the source tokens.")


class TranslateResponse(BaseModel):
    translations: list[str] = Field(description="The best translation of each sentence (empty for an empty one).")
    nbest: list[list[Hypothesis]] | None = Field(None, description="With nbest > 1: each sentence's hypotheses, "
                                                                      "best first.")
    alignments: list[Alignment | None] | None = Field(None, description="With attention: each best translation's "
                                                                          "(null for an empty sentence).")
    missing: list[list[str]] | None = Field(None, description="With constraints: the phrases each best translation "
                                                              "lacks (none where every one is held).")


class ErrorResponse(BaseModel):
    error: str = Field(description="What is wrong, in one line.")


class Health(BaseModel):
    status: Literal["ok", "draining"]
    requests: int = Field(description="Requests taken since the start.")
    searches: int = Field(description="Searches run since the start (requests share them).")


def problem(error: ValidationError) -> str:
    """The first thing wrong with a request, in one line naming the option or the sentence."""
    first = error.errors()[0]
    where = [str(part) for part in first["loc"]]
    if first["type"] == "extra_forbidden":
        return (f"unknown option {where[0]!r} (known: text, source, target, prefixes, attention, constraints, avoid, "
                f"{', '.join(REQUEST_OPTIONS)})")
    if where[0] in ("text", "prefixes") and len(where) > 1:
        what = "sentence" if where[0] == "text" else "prefix"
        return f"{what} {int(where[1]) + 1}: {first['msg'][0].lower()}{first['msg'][1:]}"
    return f"{'.'.join(where)}: {first['msg'][0].lower()}{first['msg'][1:]}"


class BadRequest(ValueError):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def parse(body: Any, config: ServeConfig) -> Any:
    """A /translate body as a TranslateRequest: its sentences within the server's --max-sentences
    and --max-chars, one line each."""
    if not isinstance(body, dict) or not isinstance(body.get("text"), list):
        raise BadRequest(400, 'the body must be a JSON object with "text": a list of sentences')
    if len(body["text"]) > config.max_sentences:
        raise BadRequest(413, f"{len(body['text'])} sentences, more than the server's --max-sentences "
                              f"{config.max_sentences}")
    try:
        request = TranslateRequest.model_validate(body)
    except ValidationError as e:
        raise BadRequest(400, problem(e)) from None
    check_lines(request.text, config)
    if request.prefixes is not None:
        if len(request.prefixes) != len(request.text):
            raise BadRequest(400, f"{len(request.prefixes)} prefixes for {len(request.text)} sentences: one each")
        check_lines(request.prefixes, config, "prefix")
    for name in ("constraints", "avoid"):
        phrases = getattr(request, name)
        if phrases is None:
            continue
        if len(phrases) != len(request.text):
            raise BadRequest(400, f"{len(phrases)} lists of {name} for {len(request.text)} sentences: one each")
        if (request.sampling or request.mbr and request.mbr_candidates == "sample") and any(phrases):
            raise BadRequest(400, f"{name} apply to beam search, not with sampling")
        check_lines([phrase for each in phrases for phrase in each], config, "phrase")
    return request


def check_lines(lines: list[str], config: ServeConfig, what: str = "sentence") -> None:
    """Each of `lines` one line, within --max-chars."""
    for number, line in enumerate(lines, start=1):
        if "\n" in line:
            raise BadRequest(400, f"{what} {number}: not one line")
        if len(line) > config.max_chars:
            raise BadRequest(413, f"{what} {number}: {len(line)} characters, more than the server's "
                                  f"--max-chars {config.max_chars}")


def search_config(options: dict[str, Any], sentences: int, config: ServeConfig,
                  defaults: SearchConfig = SearchConfig()) -> SearchConfig:
    """The search of a request's `options` (the others: `defaults`, the model's, their length within
    the server's --max-output-tokens), refused past the server's limits."""
    try:
        base = {**asdict(defaults), "max_len_b": min(defaults.max_len_b, config.max_output_tokens)}
        search = SearchConfig(**{**base, **options, "max_len": config.max_output_tokens})
        check_applies(search, options, name=lambda f: f.name)
    except ValueError as e:
        raise BadRequest(400, str(e)) from None
    check_cost(search, sentences, config)
    return search


def check_cost(search: SearchConfig, sentences: int, config: ServeConfig) -> None:
    """Refuse a request that would hold the translation thread longer than the server allows."""
    name, width = hypotheses(search)
    if width > config.max_beam:
        raise BadRequest(400, f"{name} {width}: more than the server's --max-beam {config.max_beam}")
    if search.max_len_b > config.max_output_tokens:
        raise BadRequest(400, f"max_len_b {search.max_len_b}: more than the server's --max-output-tokens "
                              f"{config.max_output_tokens}")
    if sentences * width > config.max_hypotheses:
        raise BadRequest(413, f"{sentences} sentences x {name} {width}: more than the server's "
                              f"--max-hypotheses {config.max_hypotheses}")


def hypotheses(search: SearchConfig) -> tuple[str, int]:
    """The option that sets how many hypotheses a sentence's search keeps, and its value."""
    if search.mbr is not None:
        return "mbr", search.mbr
    return ("nbest", search.nbest) if search.sampling else ("beam", search.beam)


def read_body(body: bytes, content_type: str | None) -> Any:
    """A request's body: JSON, or a form (application/x-www-form-urlencoded, as LibreTranslate's
    clients send: a field given twice is a list). JSON sent as a form (curl -d, urllib) is JSON."""
    form = (content_type or "").split(";")[0].strip().lower() == "application/x-www-form-urlencoded"
    if not form or body.lstrip()[:1] in (b"{", b"["):
        return read_json(body)
    try:
        form = parse_qs(body.decode("utf-8"), keep_blank_values=True)
    except UnicodeDecodeError:
        raise BadRequest(400, "the form is not UTF-8") from None
    return {key: values if len(values) > 1 else values[0] for key, values in form.items()}


def read_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        raise BadRequest(400, "the body is not JSON") from None
    except RecursionError:
        raise BadRequest(400, "the body is JSON nested too deeply") from None
