"""Ad-hoc SQL over a spans folder through the builder's views (``tinkertrace spans query``)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Literal

import duckdb
import pyarrow as pa

from tinkertrace.builder.views import open_views
from tinkertrace.spanstore.reader import ReadReport
from tinkertrace.spanstore.sql import literal

QueryFormat = Literal["table", "csv", "json", "parquet"]
_COPY_OPTIONS = {"csv": "FORMAT csv, HEADER true", "json": "FORMAT json", "parquet": "FORMAT parquet"}


class QueryError(ValueError):
    """The SQL could not be run; the message says why."""


def open_query_views(spans_dir: Path) -> tuple[duckdb.DuckDBPyConnection, ReadReport]:
    """A connection with the views ``spans``, ``llm_calls``, ``rewards`` and ``rollouts``."""
    con = duckdb.connect()
    return con, open_views(con, spans_dir)


def fetch(con: duckdb.DuckDBPyConnection, sql: str, limit: int | None = None) -> pa.Table:
    """The result of ``sql`` as Arrow (at most ``limit`` rows)."""
    try:
        rel = con.sql(sql)
        if rel is None:
            return pa.table({})
        return (rel.limit(limit) if limit is not None else rel).to_arrow_table()
    except duckdb.Error as exc:
        raise QueryError(str(exc)) from exc


def export(con: duckdb.DuckDBPyConnection, sql: str, fmt: QueryFormat, output: Path | None) -> str | None:
    """Write the result as CSV, JSON lines or Parquet to ``output`` (DuckDB's COPY); without an
    output file, return the CSV/JSON text instead."""
    if fmt == "table":
        raise QueryError("format 'table' is printed, not exported")
    if fmt == "parquet" and output is None:
        raise QueryError("--format parquet needs --output FILE")
    with tempfile.TemporaryDirectory(prefix="tinkertrace-query-") as tmp:
        target = output if output is not None else Path(tmp) / f"result.{fmt}"
        quoted = literal(target)
        try:
            con.execute(f"COPY ({sql.strip().rstrip(';')}) TO {quoted} ({_COPY_OPTIONS[fmt]})")
        except duckdb.Error as exc:
            raise QueryError(str(exc)) from exc
        return None if output is not None else target.read_text()
