"""SQL text for DuckDB: literals, identifiers and span-attribute lookups, written one way everywhere.

Span attributes are stored as one JSON object per span (the ``attributes`` column); names contain dots
(``gen_ai.request.model``), so a lookup quotes the key inside the JSON path.
"""

from __future__ import annotations

from collections.abc import Iterable


def literal(value: object) -> str:
    """A string literal of ``str(value)`` (a path, a name): single quotes doubled."""
    return "'" + str(value).replace("'", "''") + "'"


def literal_list(values: Iterable[object]) -> str:
    """Literals separated by commas, for ``IN (...)`` or a list ``[...]``."""
    return ", ".join(literal(v) for v in values)


def identifier(name: str) -> str:
    """A quoted identifier (a column or view name): double quotes doubled."""
    return '"' + name.replace('"', '""') + '"'


def attr(name: str, column: str = "attributes") -> str:
    """The JSON value of attribute ``name`` of ``column`` as text (null when absent)."""
    return f"json_extract_string({column}, '$.\"{name}\"')"


def attr_json(name: str, column: str = "attributes") -> str:
    """The JSON value of attribute ``name`` of ``column`` (null when absent)."""
    return f"json_extract({column}, '$.\"{name}\"')"
