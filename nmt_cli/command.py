"""What every `nmt` command has: `--config FILE`, a YAML file of its options (the long option
names as keys, as OpenNMT-py's and Marian's users describe a run), which flags on the command
line override; `--dump-config`, the options it would run with as such a file; its reference page
named in --help; and the library's errors printed as one line."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from nmt_cli.errors import NmtError
from nmt_cli.files import small_file

DUMP = "nmt_cli.dump_config"  # ctx.meta: --dump-config was given


class Command(click.Command):
    """A command with --config and --dump-config; its --help ends with its page in docs/ (`page`:
    the page's name, by default the command's). `inputs_decide`: the defaults its inputs set in
    place of the toolkit's (a model's own search settings), which --dump-config shows."""

    def __init__(self, name: str | None, *args: Any, page: str | None = None,
                 inputs_decide: Callable[[dict[str, Any]], dict[str, Any]] | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("epilog", f"Reference: docs/{page or name}.md in nmt-cli's source.")
        super().__init__(name, *args, **kwargs)
        self.inputs_decide = inputs_decide
        self.params.append(click.Option(
            ["--config"], type=click.Path(exists=True, dir_okay=False, path_type=Path), is_eager=True,
            multiple=True, expose_value=False, callback=read_configs,
            help="Options from this YAML file (keys: the long option names); flags given here override it "
                 "(repeatable: a later file overrides an earlier one)."))
        self.params.append(click.Option(
            ["--dump-config"], is_flag=True, expose_value=False,
            callback=lambda ctx, _, on: ctx.meta.update({DUMP: on}),
            help="Print the options this command would run with, as a --config file, and exit."))

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """With --dump-config, no argument is required: the dump shows what is given and the defaults."""
        if "--dump-config" not in args:
            return super().parse_args(ctx, args)
        required = [param for param in self.params if param.required]
        for param in required:
            param.required = False
        try:
            return super().parse_args(ctx, args)
        finally:
            for param in required:
                param.required = True

    def invoke(self, ctx: click.Context) -> Any:
        if ctx.meta.get(DUMP):
            decided = self.inputs_decide(ctx.params) if self.inputs_decide else {}
            given = given_flags()
            params = {**ctx.params, **{name: value for name, value in decided.items()
                                       if name in ctx.params and name not in given}}
            click.echo(dump_config(self, params), nl=False)
            return None
        return super().invoke(ctx)


class Group(click.Group):
    """Turns the library's user errors into one-line click errors (exit code 1, no traceback);
    its commands are Commands, its groups Groups."""

    command_class = Command
    group_class = type  # a subgroup is a Group too

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except NmtError as e:
            raise click.ClickException(str(e)) from None


def option_keys(command: click.Command) -> dict[str, tuple[str, bool]]:
    """The keys a config file may use for `command`'s parameters: each long option name (an
    off-switch such as --no-bar negates its value) and each parameter's own name, with dashes or
    underscores -> (parameter name, negated)."""
    keys: dict[str, tuple[str, bool]] = {}
    for param in command.params:
        if param.name is None or param.name in ("config", "dump_config", "help"):
            continue
        for names, negated in ((param.opts, False), (getattr(param, "secondary_opts", []), True)):
            keys.update({name[2:]: (param.name, negated) for name in names if name.startswith("--")})
        keys.setdefault(param.name.replace("_", "-"), (param.name, False))
    return keys


CONFIG_BYTES = 1 << 20  # a config file holds options, not data


def read_configs(ctx: click.Context, _: click.Parameter, paths: tuple[Path, ...]) -> None:
    """Each --config file in turn (`read_config`): a later file's option overrides an earlier's."""
    for path in paths:
        read_config(ctx, path)


def options_loader(text: str) -> Any:
    """A YAML loader of a file of options: YAML's core schema less its guesses, every plain scalar
    text (as a flag's would be: `beam: 010` is 10, `target-lang: no` the language "no", `1:30`
    no number) but null; an alias (*name) refused, so that a small file cannot expand."""
    import yaml

    class OptionsLoader(yaml.SafeLoader):
        yaml_implicit_resolvers = {first: [(tag, regexp) for tag, regexp in resolvers if tag == NULL_TAG]
                                   for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                raise yaml.composer.ComposerError(None, None, "an alias (*name): a file of options spells out each "
                                                  "value", self.peek_event().start_mark)
            return super().compose_node(parent, index)

    return OptionsLoader(text)


NULL_TAG = "tag:yaml.org,2002:null"


def read_config(ctx: click.Context, path: Path) -> None:
    """Make the options of the YAML file at `path` the command's defaults (ctx.default_map), so
    that flags given on the command line override them. Each value is taken as a flag's text
    would be, by the option's own type; an unknown key, a key given twice, a value of the wrong
    kind, and a file that is not a small regular file are refused in one line naming the file
    (and the line)."""
    import yaml

    loader = options_loader(config_text(path))
    try:  # safe_load's steps, keeping the document's nodes for their lines
        node = loader.get_single_node()
        values, lines = (None, {}) if node is None else (loader.construct_document(node), key_lines(node, path))
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f":{where.line + 1}" if where is not None else ""
        raise click.ClickException(f"{path}{line}: not a YAML file ({getattr(e, 'problem', None) or e})") from None
    except RecursionError:
        raise click.ClickException(f"{path}: nested too deeply to be a file of options") from None
    finally:
        loader.dispose()
    values = {} if values is None else values  # an empty file
    if not isinstance(values, dict):
        raise click.ClickException(f"{path}: expected option: value lines (a YAML mapping), "
                                   f"got a {type(values).__name__}")
    keys, params, defaults = option_keys(ctx.command), {p.name: p for p in ctx.command.params}, {}
    for key, value in values.items():
        where = f"{path}:{lines.get(str(key).replace('_', '-'), '?')}"
        if str(key).replace("_", "-") not in keys:
            raise click.ClickException(f"{where}: {key!r} is not an option of `nmt {ctx.info_name}` "
                                       f"(see nmt {ctx.info_name} --help)")
        name, negated = keys[str(key).replace("_", "-")]
        typed = config_value(ctx, params[name], value, f"{where}: {key}")
        defaults[name] = (not typed) if negated else typed
    ctx.default_map = {**(ctx.default_map or {}), **defaults}


def config_text(path: Path) -> str:
    """The text of a config file: a regular file of at most CONFIG_BYTES (not a device that never
    ends, nor data given by mistake), in UTF-8."""
    try:
        return small_file(path, "a config file of options", CONFIG_BYTES).decode("utf-8")
    except NmtError as e:
        raise click.ClickException(str(e)) from None
    except UnicodeDecodeError as e:
        raise click.ClickException(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def key_lines(node: Any, path: Path) -> dict[str, int]:
    """The line of each top-level key of a composed YAML document (1-based); a key given twice
    (with dashes or underscores) is refused naming both lines."""
    import yaml

    if not isinstance(node, yaml.MappingNode):
        return {}
    lines: dict[str, int] = {}
    for key, _ in node.value:
        name, line = str(key.value), key.start_mark.line + 1
        if (first := lines.get(name.replace("_", "-"))) is not None:
            raise click.ClickException(f"{path}:{line}: {name!r} again (first on line {first}): give each option once")
        lines[name.replace("_", "-")] = line
    return lines


def flag_text(value: Any, where: str) -> str:
    """A scalar of a config file as a flag would carry it."""
    if value is None:
        raise click.ClickException(f"{where}: no value (null): give one, or leave the option out")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        raise click.ClickException(f"{where}: a {'mapping' if isinstance(value, dict) else 'list'}, where the option "
                                   "takes one value")
    return str(value)


def config_value(ctx: click.Context, param: click.Parameter, value: Any, where: str) -> Any:
    """`value`, from a config file, converted by `param`'s type exactly as its flag's text would be
    (`beam: 4.7` is refused as `--beam 4.7` is, not cut to 4); where the option repeats, a list, or
    one value as a list of one."""
    if param.multiple or param.nargs != 1:
        value = value if isinstance(value, list) else [value]
        items = [[flag_text(v, where) for v in item] if param.multiple and param.nargs != 1 and
                 isinstance(item, list) else flag_text(item, where) for item in value]
    else:
        items = flag_text(value, where)
    try:
        return param.type_cast_value(ctx, items)
    except click.BadParameter as e:
        raise click.ClickException(f"{where}: {e.message}") from None


def dump_config(command: click.Command, params: dict[str, Any]) -> str:
    """`params` as a YAML config file of `command`: each set value under its long option name
    (unset ones left out: None, and a required option's empty list)."""
    import yaml

    names: dict[str, str] = {}
    for key, (name, negated) in option_keys(command).items():
        if not negated:
            names.setdefault(name, key)  # its first long option name
    plain = {names[param.name]: as_written(params[param.name]) for param in command.params
             if param.name in names and params.get(param.name) not in (None, () if param.required else None)}
    return yaml.safe_dump(plain, sort_keys=False, allow_unicode=True, default_flow_style=False)


def as_written(value: Any) -> Any:
    """A parameter's value as a config file holds it: paths as text, tuples as lists."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (tuple, list)):
        return [as_written(v) for v in value]
    return value


def given_flags() -> set[str]:
    """The parameters of the current command that the user gave: on the command line, in the
    environment, or in a --config file (whatever its value: a file says what a flag says)."""
    ctx = click.get_current_context()
    sources = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT,
               click.core.ParameterSource.DEFAULT_MAP)
    return {name for name in ctx.params if ctx.get_parameter_source(name) in sources}


def changed_flags() -> set[str]:
    """The given parameters (`given_flags`) but those a --config file sets to their default: what
    a refusal of an option that does not apply looks at, so that a --dump-config file, which holds
    every default, reads back."""
    ctx = click.get_current_context()
    defaults = {param.name: param.default for param in ctx.command.params}
    from_file = click.core.ParameterSource.DEFAULT_MAP
    return {name for name in given_flags() if ctx.get_parameter_source(name) is not from_file
            or as_written(ctx.params[name]) != as_written(defaults.get(name))}
