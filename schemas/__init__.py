"""The one definition of every stored table (spans, logs, triplets, trajectories), loaded from JSON.

Each ``<table>.v<N>.json`` file lists the table's columns; :func:`load` turns the newest version (or
a named one) into a :class:`pyarrow.Schema` whose metadata records the table name and version.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

import pyarrow as pa

_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "bool": pa.bool_(),
    "int8": pa.int8(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "timestamp_ns": pa.timestamp("ns", tz="UTC"),
    "list<int8>": pa.list_(pa.int8()),
    "list<int32>": pa.list_(pa.int32()),
    "list<int64>": pa.list_(pa.int64()),
    "list<float32>": pa.list_(pa.float32()),
}


def _definition_files() -> dict[tuple[str, int], Any]:
    found: dict[tuple[str, int], Any] = {}
    for entry in resources.files(__name__).iterdir():
        if entry.name.endswith(".json"):
            definition = json.loads(entry.read_text())
            found[(definition["table"], int(definition["version"]))] = definition
    return found


@cache
def definition(table: str, version: int | None = None) -> dict[str, Any]:
    """The JSON definition of ``table`` (newest version unless ``version`` is given)."""
    files = _definition_files()
    versions = sorted(v for (name, v) in files if name == table)
    if not versions:
        raise KeyError(f"no schema named {table!r} in tinkertrace.schemas")
    chosen = versions[-1] if version is None else version
    if (table, chosen) not in files:
        raise KeyError(f"schema {table!r} has no version {chosen} (have {versions})")
    return files[(table, chosen)]


@cache
def load(table: str, version: int | None = None) -> pa.Schema:
    """The Arrow schema of ``table``, with ``tinkertrace.table`` / ``tinkertrace.version`` metadata."""
    spec = definition(table, version)
    fields = [
        pa.field(c["name"], _TYPES[c["type"]], nullable=c.get("nullable", True)) for c in spec["columns"]
    ]
    meta = {"tinkertrace.table": spec["table"], "tinkertrace.version": str(spec["version"])}
    return pa.schema(fields, metadata=meta)


def spans() -> pa.Schema:
    return load("spans")


def triplets() -> pa.Schema:
    return load("triplets")


def trajectories() -> pa.Schema:
    return load("trajectories")


def logs() -> pa.Schema:
    return load("logs")


def sort_keys(table: str) -> list[str]:
    """Columns a writer sorts by so related rows sit together."""
    return list(definition(table).get("sort_by", []))
