"""Command-line options made from settings dataclasses, so each setting is written once.

A field declared with :func:`tinkertrace.training.config.setting` carries its help text (and its
flag names, where the default ``--field-name`` will not do). A command wrapped by
:func:`with_settings` takes a parameter ``name: dict[str, Any] = OptionsOf(SomeSettings)``: that
parameter becomes one option per field (an argument where the field says so), in its place, and
the command receives the values given on the command line as a dict, field name → value, to lay
over a config file or the dataclass defaults (an option left at its default is not in the dict).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import typer

F = TypeVar("F", bound=Callable[..., Any])
S = TypeVar("S")


@dataclass(frozen=True)
class OptionsOf:
    """Marks a command parameter that stands for the command-line fields of ``settings``."""

    settings: type
    help_prefix: str = ""  # e.g. "--follow: " for options that only act with another


def cli_fields(settings: type) -> list[dataclasses.Field[Any]]:
    """The fields of ``settings`` that are command-line options or arguments."""
    return [f for f in dataclasses.fields(settings) if f.metadata.get("cli")]


def file_only_fields(settings: type) -> list[str]:
    """Names of the documented fields that are set in a config file (or code) only."""
    return [f.name for f in dataclasses.fields(settings) if "help" in f.metadata and not f.metadata["cli"]]


def validated(settings: type[S], **values: Any) -> S:
    """``settings(**values).validate()``; its ConfigError as a bad parameter of the command."""
    from tinkertrace.training.errors import ConfigError

    try:
        return settings(**values).validate()  # type: ignore[attr-defined]
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None


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
        hints = typing.get_type_hints(marker.settings)
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
    info: Any
    if meta["argument"]:
        info = typer.Argument(help=meta["help"], show_default=False)
    else:
        text = meta["help"]
        if marker.help_prefix:
            text = marker.help_prefix + text[:1].lower() + text[1:]
        info = typer.Option(*meta["flags"], help=text, envvar=meta["envvar"])
    if field.default is not dataclasses.MISSING:
        default = field.default
    elif field.default_factory is dataclasses.MISSING:
        default = inspect.Parameter.empty  # a setting without a default: a required option
    else:
        default = None
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
    if origin is Literal:
        return str
    if origin is dict:
        return list[str]
    return kind
