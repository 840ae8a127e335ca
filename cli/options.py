"""Command-line options made from settings dataclasses, so each setting is written once.

A field declared with :func:`tinkertrace.settings.setting` carries its help text (and its flag names,
where the default ``--field-name`` will not do, and its environment variable). A command wrapped by
:func:`with_settings` takes a parameter ``name: dict[str, Any] = OptionsOf(SomeSettings)``: that
parameter becomes one option per field (an argument where the field says so), in its place, and
the command receives the values given on the command line as a dict, field name → value, to lay
over a config file or the dataclass defaults (an option left at its default is not in the dict):
:func:`validated` does that, with :func:`config_option` for the command's ``--config`` file.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import types
import typing
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import typer

from tinkertrace.settings import field_kinds, is_required

F = TypeVar("F", bound=Callable[..., Any])
S = TypeVar("S")


class OptionsOf(dict[str, Any]):
    """Marks a command parameter that stands for the command-line fields of ``settings``. It is an
    (empty) dict, as the value the command receives in its place is."""

    def __init__(self, settings: type, help_prefix: str = "") -> None:
        super().__init__()
        self.settings = settings
        self.help_prefix = help_prefix  # e.g. "--follow: " for options that only act with another


def cli_fields(settings: type) -> list[dataclasses.Field[Any]]:
    """The fields of ``settings`` that are command-line options or arguments."""
    return [f for f in dataclasses.fields(settings) if f.metadata.get("cli")]


def file_only_fields(settings: type) -> list[str]:
    """Names of the documented fields that are set in a config file (or code) only."""
    return [f.name for f in dataclasses.fields(settings) if f.metadata.get("help") and not f.metadata["cli"]]


def config_option(*settings: type, section: str | None = None) -> Any:
    """The ``--config FILE`` option of a command whose settings are ``settings``: its help lists the keys
    that only a file sets (the options' names are keys too)."""
    only = sorted({name for kind in settings for name in file_only_fields(kind)})
    where = f" (flat, or under a '{section}' table)" if section else ""
    extra = f", and also {', '.join(only)}" if only else ""
    return typer.Option(
        "--config",
        help=f"YAML or TOML file of settings{where}: these options' names{extra}; options and environment "
        "variables win.",
    )


def validated(
    settings: type[S],
    given: dict[str, Any],
    file: Path | None = None,
    section: str | None = None,
    flat: bool = True,
) -> S:
    """:func:`tinkertrace.settings.load` of ``settings``; its ConfigError as the command's bad parameter."""
    from tinkertrace.settings import ConfigError, load

    try:
        return load(settings, file, given, section=section, flat=flat, what="option")
    except ConfigError as exc:
        raise typer.BadParameter(_as_flags(str(exc), settings)) from None


def _as_flags(message: str, settings: type) -> str:
    """``message`` with each problem's leading field name written as its option (``--tool-parser``)."""
    for field in cli_fields(settings):
        if field.metadata["argument"]:
            continue
        flag = (field.metadata["flags"] or (f"--{field.name.replace('_', '-')}",))[0].split("/")[0]
        message = re.sub(rf"(^|: |; )({field.name})\b", rf"\g<1>{flag}", message)
    return message


def with_settings(command: F) -> F:
    """``command`` with each :class:`OptionsOf` parameter expanded into its fields' options."""
    signature = inspect.signature(command, eval_str=True)
    params: list[inspect.Parameter] = []
    groups: dict[str, list[str]] = {}
    for param in signature.parameters.values():
        marker = param.default
        if not isinstance(marker, OptionsOf):
            params.append(param.replace(kind=inspect.Parameter.KEYWORD_ONLY))
            continue
        hints = field_kinds(marker.settings)
        fields = [_parameter(f, marker, hints[f.name]) for f in cli_fields(marker.settings)]
        groups[param.name] = [f.name for f in fields]
        params.extend(fields)
    names = [p.name for p in params]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise TypeError(f"{command.__name__}: options named twice: {', '.join(clashes)}")

    @functools.wraps(command)
    def run(_context: typer.Context, **values: Any) -> Any:
        source = _context.get_parameter_source
        for group, fields in groups.items():
            given = {name: values.pop(name) for name in fields}
            values[group] = {
                name: value
                for name, value in given.items()
                if (given_by := source(name)) is None or given_by.name != "DEFAULT"  # a ParameterSource
            }
        return command(**values)

    del run.__wrapped__  # typer reads the signature below, not the wrapped function's
    params.append(inspect.Parameter("_context", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))
    run.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in params}
    return run  # type: ignore[return-value]


def _parameter(field: dataclasses.Field[Any], marker: OptionsOf, hint: Any) -> inspect.Parameter:
    meta = field.metadata
    kind = _cli_type(hint)
    text = meta["help"] + (" Required (here or in --config)." if is_required(field) else "")
    info: Any
    if meta["argument"]:
        info = typer.Argument(metavar=field.name.upper(), help=text, show_default=False)
    else:
        if marker.help_prefix:
            text = marker.help_prefix + text[:1].lower() + text[1:]
        info = typer.Option(*meta["flags"], help=text, envvar=meta["envvar"])
    # a factory's value, or a required setting (which a --config file may give instead): None
    default = None if field.default is dataclasses.MISSING else field.default
    return inspect.Parameter(
        field.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[kind | None, info]
    )


def _cli_type(kind: Any) -> Any:
    """The type typer parses a field as: its optional part unwrapped; Literal choices as text
    (checked by the settings' own validation, with its message); a mapping as repeated key=value."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        (kind,) = [a for a in typing.get_args(kind) if a is not type(None)]
        origin = typing.get_origin(kind)
    if origin is Literal or kind is datetime:
        return str
    if origin in (dict, tuple, list):
        return list[str]
    return kind
