"""The config dataclasses as click flags: one flag per field with help (`d_ff` -> `--d-ff`), its
default, range and help taken from the field, its value checked by options.knob_problem, and a
flag given where it would be ignored refused (options.check_applies)."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from nmt_cli.command import changed_flags
from nmt_cli.model.architecture import PRESETS, ModelConfig
from nmt_cli.options import check_applies, knob_problem


class _Knob:
    """A number flag checked by `config.knob_problem`, the one check of every option (click's
    range types are kept for the range they show in --help)."""

    meta: Any

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        value = self.base.convert(value, param, ctx)
        if (problem := knob_problem(value, self.meta)) is not None:
            self.fail(f"{value}: {problem}", param, ctx)
        return value


class IntKnob(_Knob, click.IntRange):
    base = click.INT

    def __init__(self, meta: Any) -> None:
        super().__init__(min=meta.get("min"), max=meta.get("max"))  # config.INT_MAX goes without saying
        self.meta = meta


class FloatKnob(_Knob, click.FloatRange):
    base = click.FLOAT

    def __init__(self, meta: Any) -> None:
        super().__init__(min=meta.get("min"), max=meta.get("max"), min_open=meta.get("exclusive_min", False),
                         max_open=meta.get("exclusive_max", False))
        self.meta = meta


def _click_type(hint: Any, meta: Any) -> click.ParamType:
    if "choices" in meta:
        return click.Choice(meta["choices"])
    if isinstance(hint, types.UnionType):  # `int | None`
        hint = next(t for t in typing.get_args(hint) if t is not type(None))
    if typing.get_origin(hint) is tuple:  # a repeatable flag
        hint = typing.get_args(hint)[0]
    if hint is Path:
        return click.Path(path_type=Path, **meta["path"])
    if hint is str:
        return click.STRING
    return IntKnob(meta) if hint is int else FloatKnob(meta)


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None if f.default is dataclasses.MISSING else f.default


def config_options(cls: type, show_defaults: bool = True) -> Callable[[Callable], Callable]:
    """One flag per field of a config dataclass that has help (`d_ff` -> `--d-ff`), its default,
    range and help taken from the field. Without `show_defaults` every flag defaults to None,
    meaning "keep the preset's value"."""
    hints = typing.get_type_hints(cls)  # the annotations are strings (`from __future__ import annotations`)

    def decorate(command: Callable) -> Callable:
        for f in reversed(dataclasses.fields(cls)):
            if "help" in f.metadata:
                command = _option(f, hints[f.name], show_defaults)(command)
        return command

    return decorate


def _option(f: dataclasses.Field, hint: Any, show_defaults: bool) -> Callable[[Callable], Callable]:
    meta = f.metadata
    names = list(meta.get("flags", ["--" + f.name.replace("_", "-")]))
    default = _default(f) if show_defaults else None
    if hint is bool:
        if "negation" in meta:
            names[-1] = f"{names[-1]}/{meta['negation']}"
            return click.option(*names, f.name, default=default, show_default=True, help=meta["help"])
        return click.option(*names, f.name, is_flag=True, default=None, help=meta["help"])
    return click.option(*names, f.name, type=_click_type(hint, meta), default=default,
                        multiple=typing.get_origin(hint) is tuple,
                        required=f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
                        show_default=default not in (None, ()), help=meta["help"])


def fields_of(cls: type, options: dict[str, Any]) -> dict[str, Any]:
    """Take the values of `cls`'s flags out of a command's keyword arguments."""
    return {f.name: options.pop(f.name) for f in dataclasses.fields(cls) if f.name in options}


def build(cls: type, **values: Any) -> Any:
    """`cls(**values)` without the flags left unset; a bad combination, or a flag given where it
    does not apply, is a usage error."""
    try:
        config = cls(**{k: v for k, v in values.items() if v is not None})
        check_applies(config, changed_flags())
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    return config


def model_options(command: Callable) -> Callable:
    """`--arch` plus every ModelConfig field as a flag, defaulting to the preset's value."""
    command = config_options(ModelConfig, show_defaults=False)(command)
    return click.option("--arch", type=click.Choice(sorted(PRESETS)), default="base", show_default=True,
                        help="Preset: base/big (Table 3), iwslt, small (CPU), student (3+1 layers: "
                             "data/distill.sh).")(command)


def build_model_config(arch: str, overrides: dict[str, Any]) -> ModelConfig:
    """The preset `arch` with the command-line overrides; a bad combination is a usage error."""
    try:
        return PRESETS[arch].replace(**fields_of(ModelConfig, overrides))
    except ValueError as e:
        raise click.UsageError(str(e)) from None
