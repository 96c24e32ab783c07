"""An option: a dataclass field with its default, help, range and the settings it applies to
(`knob`), and the one check of a value against them (`knob_problem`), whichever way the value
came: a flag (flags.py), a request (serve/schemas.py), a saved config, the Python API."""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from collections.abc import Callable, Collection
from dataclasses import field
from pathlib import Path
from typing import Any

INT_MAX = 2**31 - 1  # the ceiling of every integer option without a lower one of its own


def knob(default: Any, help: str, **flag: Any) -> Any:
    """A config field with its command-line help and flag details: range (`min`, `max`, both
    inclusive unless `exclusive_min`/`exclusive_max`; integers stop at INT_MAX unless `max` says,
    floats must be finite), `choices`, `pattern` (a regular expression a str matches whole, and
    the words that say what it means), `only_if` (a predicate on the config and the words that
    say when the field applies: setting it otherwise is refused), `flags` (the names, when not
    `--field-name`), `negation` (the off-switch of a flag that is on by default), `path`
    (click.Path's checks). MISSING: required."""
    return field(default=default, metadata={"help": help, **flag})


def knob_problem(value: Any, meta: Any) -> str | None:
    """What is wrong with `value` for a field with metadata `meta` (None: nothing)."""
    if "choices" in meta and value is not None and value not in meta["choices"]:
        return f"expected one of {', '.join(map(str, meta['choices']))}"
    if "pattern" in meta and isinstance(value, str) and not re.fullmatch(meta["pattern"][0], value):
        return f"expected {meta['pattern'][1]}"
    if value is None or isinstance(value, (bool, Path, str)) or dataclasses.is_dataclass(value):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    low, high = meta.get("min"), meta.get("max", INT_MAX if isinstance(value, int) else None)
    if low is not None and (value <= low if meta.get("exclusive_min") else value < low):
        return f"must be {'>' if meta.get('exclusive_min') else '>='} {low}"
    if high is not None and (value >= high if meta.get("exclusive_max") else value > high):
        return f"must be {'<' if meta.get('exclusive_max') else '<='} {high}"
    return None


TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def type_problem(value: Any, hint: Any) -> str | None:
    """What is wrong with the type of `value` for a field annotated `hint` (None: nothing): an
    int is a number too, a bool is neither; other annotations (paths, tuples, configs) pass."""
    union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
    kinds = typing.get_args(hint) if union else (hint,)
    if value is None:
        return None if type(None) in kinds else "expected a value, not None"
    if any(fits(value, kind) for kind in kinds):
        return None
    return "expected " + " or ".join(TYPE_NAMES[kind] for kind in kinds if kind in TYPE_NAMES)


def fits(value: Any, kind: Any) -> bool:
    """Whether `value` is of the annotated `kind`; kinds without a name here always fit."""
    if kind not in TYPE_NAMES:
        return True
    if kind in (int, float) and isinstance(value, bool):
        return False
    return isinstance(value, (int, float) if kind is float else kind)


@functools.cache
def type_hints(config_class: type) -> dict[str, Any]:
    return typing.get_type_hints(config_class)


def check_knobs(config: Any) -> None:
    """Validate every field of a config dataclass against its type, range and choices."""
    hints = type_hints(type(config))
    for f in dataclasses.fields(config):
        values = getattr(config, f.name)
        if (problem := type_problem(values, hints[f.name])) is not None:
            raise ValueError(f"{f.name}={values!r}: {problem}")
        for value in values if isinstance(values, tuple) else (values,):
            if (problem := knob_problem(value, f.metadata)) is not None:
                raise ValueError(f"{f.name}={value!r}: {problem}")


def flag_name(f: dataclasses.Field) -> str:
    """The command-line name of a config field: `d_ff` -> `--d-ff`, its long flag, or both
    names of an on/off flag."""
    name = f.metadata.get("flags", ["--" + f.name.replace("_", "-")])[-1]
    return f"{name}/{f.metadata['negation']}" if "negation" in f.metadata else name


def check_applies(config: Any, given: Collection[str], name: Callable[[dataclasses.Field], str] = flag_name) -> None:
    """Refuse a field that was `given` (set by the user) where it would be ignored: its
    `only_if` predicate is false for `config` (`--beam` with `--sampling`, say)."""
    for f in dataclasses.fields(config):
        if f.name in given and "only_if" in f.metadata:
            applies, when = f.metadata["only_if"]
            if not applies(config):
                raise ValueError(f"{name(f)} applies only {when}")


class Options:
    """The base of the config dataclasses: every field is checked when one is made, and
    `to_dict` is what checkpoints and data directories keep."""

    def __post_init__(self) -> None:
        check_knobs(self)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
