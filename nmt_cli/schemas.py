"""The bodies of `nmt serve`'s requests and answers as pydantic models, FastAPI's way: its
/openapi.json and /docs show them. A request's search options are SearchConfig's own fields
(config.py), with their help, type and range, so an option is declared once for flags, the
Python API and requests.
"""

from dataclasses import fields
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from nmt_cli.config import SearchConfig

# SearchConfig's fields that a request may set (the others are the server's: max_len, or not yet served).
REQUEST_OPTIONS = ("beam", "nbest", "lenpen", "lenpen_form", "stopping", "max_len_a", "max_len_b", "allow_unk",
                   "sampling", "sampling_topk", "sampling_topp", "temperature", "seed")
TYPES = {"int": int, "float": float, "str": str, "bool": bool, "int | None": int, "float | None": float}


def option(name: str) -> tuple[Any, Any]:
    """The pydantic field of SearchConfig's `name`: optional (the server's default), its knob's
    help, choices and range."""
    knob = next(f for f in fields(SearchConfig) if f.name == name)
    meta = knob.metadata
    kind = Literal[tuple(meta["choices"])] if "choices" in meta else TYPES[knob.type]
    bounds = {}
    if "min" in meta:
        bounds["gt" if meta.get("exclusive_min") else "ge"] = meta["min"]
    if "max" in meta:
        bounds["lt" if meta.get("exclusive_max") else "le"] = meta["max"]
    return kind | None, Field(None, description=meta["help"], **bounds)


TranslateRequest = create_model(
    "TranslateRequest", __config__=ConfigDict(extra="forbid", strict=True, allow_inf_nan=False),
    __doc__="Sentences to translate, one line each, with search options (those not given: the server's).",
    text=(list[str], Field(description="The sentences, one line each.")),
    **{name: option(name) for name in REQUEST_OPTIONS})


class Hypothesis(BaseModel):
    text: str = Field(description="The translation.")
    score: float = Field(description="Its log-probability divided by the length penalty: what ranks it.")
    log_prob: float = Field(description="Its log-probability.")


class TranslateResponse(BaseModel):
    translations: list[str] = Field(description="The best translation of each sentence (empty for an empty one).")
    nbest: list[list[Hypothesis]] | None = Field(None, description="With nbest > 1: each sentence's hypotheses, "
                                                                      "best first.")


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
        return f"unknown option {where[0]!r} (known: text, {', '.join(REQUEST_OPTIONS)})"
    if where[:1] == ["text"] and len(where) > 1:
        return f"sentence {int(where[1]) + 1}: {first['msg'][0].lower()}{first['msg'][1:]}"
    return f"{'.'.join(where)}: {first['msg'][0].lower()}{first['msg'][1:]}"
