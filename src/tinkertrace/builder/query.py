"""Ad-hoc SQL over a spans folder through the builder's views (``tinkertrace spans query``)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Literal

import duckdb
import pyarrow as pa

from tinkertrace.builder import views
from tinkertrace.builder.sources import open_sources
from tinkertrace.spanstore.reader import ReadReport
from tinkertrace.spanstore.sql import literal

QueryFormat = Literal["table", "csv", "json", "parquet"]
_COPY_OPTIONS = {"csv": "FORMAT csv, HEADER true", "json": "FORMAT json", "parquet": "FORMAT parquet"}


class QueryError(ValueError):
    """The SQL could not be run; the message says why."""


def open_views(
    con: duckdb.DuckDBPyConnection,
    spans_dir: Path,
    files: tuple[Path, ...] | None = None,
    *,
    task_key: str = views.DEFAULT_TASK_KEY,
) -> ReadReport:
    """Open ``spans_dir`` (or just ``files``) for ad-hoc SQL: the views ``spans_raw``, ``logs``,
    ``spans_typed``, ``spans``, ``llm_calls``, ``rewards`` and ``rollouts``; returns the reader's
    report."""
    sources = open_sources(con, spans_dir, files)
    typed = views.create_typed(con, sources.raw)
    views.create_derived_views(con, views.create_spans(con, sources.raw, typed, task_key=task_key))
    return sources.report


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
