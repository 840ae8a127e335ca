"""Settings, each declared once: a dataclass field made by :func:`setting` carries its type, default,
help text and environment variable. Everything else is derived from that declaration:

- a command's options (``tinkertrace.cli.options.with_settings``) and its ``--config`` file keys;
- the environment lookups (``load`` reads each field's variable; typer reads the same one);
- validation: values are coerced to the field's type (a ``Literal`` is a set of choices) with a
  :class:`ConfigError` naming the key, then the class's own ``validate()`` (or ``__post_init__``) runs.

Precedence: defaults < config file < environment < values given (options, ``init()`` arguments).
Light on purpose (no third-party import at module level): the SDK and every command's help import it.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import sys
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

from tinkertrace.netutil import LOOPBACK

S = TypeVar("S")


class UserError(Exception):
    """A problem the user can fix (a value, a file, a service), reported by the CLI as one message."""


class ConfigError(UserError, ValueError):
    """A bad configuration value, unknown key or unreadable config file."""


def raise_problems(checks: Iterable[tuple[bool, str]], what: str) -> None:
    """Raise one :class:`ConfigError` ``"<what>: <problem>; <problem>"`` naming every failed check."""
    problems = [message for ok, message in checks if not ok]
    if problems:
        raise ConfigError(f"{what}: " + "; ".join(problems))


def setting(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    flags: tuple[str, ...] = (),
    cli: bool = True,
    argument: bool = False,
    envvar: str | None = None,
    aliases: tuple[str, ...] = (),
    default_factory: Any = dataclasses.MISSING,
) -> Any:
    """A dataclass field with its help text: a command-line option unless ``cli=False`` (then it is set
    in a config file or in code only). ``flags`` replace the option's default name (``--field-name``,
    and ``--no-field-name`` for a bool); ``argument`` makes it positional; ``envvar`` names the
    environment variable that sets it; ``aliases`` are other keys a config file may give it by (another
    system's names for the same setting). A field without help is internal: not an option, not a file key."""
    metadata = {"help": help, "cli": cli and bool(help), "flags": flags, "argument": argument}
    metadata["envvar"], metadata["aliases"] = envvar, aliases
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def listen_host() -> Any:
    """The ``host`` setting of every server: where it binds, loopback unless told otherwise."""
    return setting(LOOPBACK, "Address to bind (loopback by default; 0.0.0.0 exposes it to the network).")


def listen_port(default: int, help: str = "TCP port to listen on (0: a free one).") -> Any:
    """A server's port setting with its own default; :func:`port_check` validates it."""
    return setting(default, help)


def port_check(*ports: int) -> tuple[bool, str]:
    """The one range check of listen ports, as a ``(ok, problem)`` pair for :func:`raise_problems`."""
    return all(0 <= port <= 65535 for port in ports), "ports must be in 0..65535"


def is_required(field: dataclasses.Field[Any]) -> bool:
    """Whether a field has no default (nor default factory)."""
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING


def field_kinds(settings: type) -> dict[str, Any]:
    """Each field's type; ``Any`` for one whose annotation names a type only imported for checking."""
    namespace = vars(sys.modules[settings.__module__])
    kinds = {}
    for f in dataclasses.fields(settings):
        try:
            kinds[f.name] = eval(f.type, namespace) if isinstance(f.type, str) else f.type
        except NameError:
            kinds[f.name] = Any
    return kinds


def check_choices(settings: Any) -> list[tuple[bool, str]]:
    """A ``(ok, problem)`` check per ``Literal``-typed field of a settings dataclass instance."""
    checks = []
    for name, kind in field_kinds(type(settings)).items():
        if get_origin(kind) is Literal:
            choices = get_args(kind)
            checks.append((getattr(settings, name) in choices, f"{name} must be one of {', '.join(choices)}"))
    return checks


def coerce(key: str, value: Any, kind: Any) -> Any:
    """``value`` (from a file, the environment or an option) as a ``kind``; ConfigError naming ``key``."""
    origin, args = get_origin(kind), get_args(kind)
    if kind is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return coerce(key, value, inner)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(str, args))}")
        return value
    if origin is list and dataclasses.is_dataclass(args[0]):  # a list of settings (a file's tables)
        item_kind: Any = args[0]
        keyed = getattr(item_kind, "keyed", None)  # a mapping keyed by name, where the class reads one
        if isinstance(value, dict) and callable(keyed):
            value = [keyed(str(name), entry) for name, entry in value.items()]
        if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
            raise ConfigError(f"{key}: expected a list of mappings, got {value!r}")
        return [load(item_kind, given=item, what=f"{key}[{i}] setting") for i, item in enumerate(value)]
    if origin is dict:
        if isinstance(value, str | list | tuple) and all(isinstance(v, str) for v in value):
            value = parse_key_values([value] if isinstance(value, str) else list(value), what=key)
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return {str(k): coerce(f"{key}.{k}", v, args[1]) for k, v in value.items()}
    if origin in (tuple, list, frozenset):
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple | set | frozenset):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return origin(coerce(key, item, args[0]) for item in items)
    if kind not in (str, int, float, bool, Path, datetime):  # an object given in code (a callable, ...)
        return value
    if kind is datetime:
        try:
            return _datetime(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: {value!r} is not an ISO-8601 date/time") from None
    try:
        if kind is bool:
            if isinstance(value, str) and value.strip().lower() in _BOOLS:
                return _BOOLS[value.strip().lower()]
            if not isinstance(value, bool):
                raise TypeError
            return value
        if kind is int and isinstance(value, float) and not value.is_integer():
            raise TypeError
        if kind in (int, float) and isinstance(value, bool):
            raise TypeError
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: {value!r} is not a valid {getattr(kind, '__name__', kind)}") from None


_BOOLS = dict.fromkeys(("true", "1", "yes", "on"), True) | dict.fromkeys(("false", "0", "no", "off"), False)


def _datetime(value: Any) -> datetime:
    """An ISO-8601 date or time (UTC unless it names a zone)."""
    parsed = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def parse_key_values(items: list[str], what: str, split_commas: bool = True) -> dict[str, str]:
    """``["a=1", "b=x,c=2"]`` → ``{"a": "1", "b": "x", "c": "2"}`` (repeated or, with ``split_commas``,
    comma-separated pairs)."""
    out: dict[str, str] = {}
    for item in items:
        for part in filter(None, (p.strip() for p in (item.split(",") if split_commas else [item]))):
            name, sep, raw = part.partition("=")
            if not sep or not name.strip() or not raw.strip():
                raise ConfigError(f"{what}: expected key=value, got {part!r}")
            out[name.strip()] = raw.strip()
    return out


def read_config_file(path: Path, section: str | None = None, flat: bool = True) -> dict[str, Any]:
    """The settings in a ``.yaml``/``.yml``/``.toml`` file: its ``section`` table when it has one, else
    the whole file (flat) or, with ``flat=False``, nothing."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    import yaml  # here, not at the top: the SDK and the command line's help import this module

    text = path.read_text()
    try:
        if path.suffix.lower() == ".toml":
            data: Any = tomllib.loads(text)
        elif path.suffix.lower() in (".yaml", ".yml"):
            data = yaml.safe_load(text) or {}
        else:
            raise ConfigError(f"config file {path} must end in .yaml, .yml or .toml")
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"config file {path} is not valid: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of settings")
    if section is not None and isinstance(data.get(section), dict):
        return data[section]
    return data if flat else {}


def aliases(settings: type) -> dict[str, str]:
    """Each alias of a field of ``settings`` → the field's name."""
    return {alias: f.name for f in dataclasses.fields(settings) for alias in f.metadata.get("aliases", ())}


def apply_edits(data: Mapping[str, Any], edits: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` (a config file's settings) with each ``edits`` key set: dotted keys reach into
    mappings, and into a list of mappings by an item's ``name`` (``environments.NAME.group_size``).
    Text values are read as YAML scalars (``64``, ``2e-5``, ``true``, ``null``)."""
    import yaml

    out = copy.deepcopy(dict(data))
    for dotted, raw in edits.items():
        value = yaml.safe_load(raw) if isinstance(raw, str) else raw
        *path, last = dotted.split(".")
        node: Any = out
        for i, part in enumerate(path):
            if isinstance(node, list):
                found = [item for item in node if isinstance(item, dict) and item.get("name") == part]
                if not found:
                    raise ConfigError(
                        f"--set {dotted}: no item named {part!r} in {'.'.join(path[:i]) or 'the file'}"
                    )
                node = found[0]
            elif (
                i == 0 or part in node
            ):  # a new top-level mapping (loss_config.beta=...), else one that exists
                node = node.setdefault(part, {})
            else:
                raise ConfigError(f"--set {dotted}: no {part!r} in {'.'.join(path[:i])}")
            if not isinstance(node, dict | list):
                raise ConfigError(f"--set {dotted}: {'.'.join(path[: i + 1])} is not a mapping")
        if not isinstance(node, dict):
            raise ConfigError(f"--set {dotted}: {'.'.join(path)} is a list; name one of its items")
        node[last] = value
    return out


def environment(settings: type, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The fields of ``settings`` whose environment variable is set (and not empty), as raw text."""
    environ = os.environ if environ is None else environ
    values = {}
    for f in dataclasses.fields(settings):
        name = f.metadata.get("envvar")
        if name and environ.get(name, "").strip():
            values[f.name] = environ[name]
    return values


def load(
    settings: type[S],
    file: Path | None = None,
    given: Mapping[str, Any] | None = None,
    *,
    section: str | None = None,
    flat: bool = True,
    skip: tuple[str, ...] = (),
    environ: Mapping[str, str] | None = None,
    what: str = "setting",
    edits: Mapping[str, Any] | None = None,
) -> S:
    """A validated ``settings`` instance: defaults, updated by ``file`` (its ``section`` table, else the
    whole file when ``flat``; its ``skip`` keys belong to other settings; ``edits``, dotted keys, laid
    over it: :func:`apply_edits`), then by the environment, then by ``given`` (None values are
    ignored). Keys may use dashes, and a field's aliases.
    ConfigError names an unknown key, a bad value, or the class's own validation problems."""
    kinds = field_kinds(settings)
    declared = dataclasses.fields(settings)  # type: ignore[arg-type]  # S is a dataclass
    internal = {f.name for f in declared if not f.metadata.get("help")}
    renamed = aliases(settings)
    merged: dict[str, Any] = {}
    from_file = read_config_file(file, section, flat) if file else {}
    layers = [
        ("config file setting", apply_edits(from_file, edits) if edits else from_file),
        ("environment setting", environment(settings, environ)),
        (what, {k: v for k, v in (given or {}).items() if v is not None}),
    ]
    for origin, layer in layers:
        for raw_key, value in layer.items():
            key = str(raw_key).replace("-", "_")
            if origin == "config file setting" and key in skip:
                continue
            if key in renamed:
                if renamed[key] in layer:
                    raise ConfigError(f"{raw_key!r} and {renamed[key]!r} name the same setting: give one")
                key = renamed[key]
            if key not in kinds or (origin == "config file setting" and key in internal):
                known = ", ".join(sorted((set(kinds) - internal) | set(renamed)))
                raise ConfigError(f"unknown {origin} {raw_key!r}; known: {known}")
            value = coerce(key, value, kinds[key])
            merged[key] = {**merged[key], **value} if isinstance(value, dict) and key in merged else value
    required = [f.name for f in declared if is_required(f) and f.name not in merged]
    if required:
        raise ConfigError(f"missing required {what}(s): {', '.join(required)}")
    try:
        instance = settings(**merged)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:  # a missing required field, or __post_init__'s own checks
        raise ConfigError(str(exc)) from None
    validate = getattr(instance, "validate", None)
    return validate() if callable(validate) else instance
