"""A DuckDB view over a folder of span Parquet files, skipping (and reporting) unreadable ones."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from tinkertrace.schemas import spans as spans_schema
from tinkertrace.spanstore.compact import superseded_inputs
from tinkertrace.spanstore.sql import identifier, literal
from tinkertrace.spanstore.writer import TEMP_PREFIX

# Extra columns the view adds to the spans schema: hive partition keys and the source file.
HIVE_TYPES = {"date": "DATE", "hour": "INTEGER"}
EXTRA_COLUMNS = {"filename": "VARCHAR", **HIVE_TYPES}

_DUCKDB_TYPES: dict[pa.DataType, str] = {
    pa.string(): "VARCHAR",
    pa.bool_(): "BOOLEAN",
    pa.int8(): "TINYINT",
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
    pa.float32(): "FLOAT",
    pa.float64(): "DOUBLE",
    pa.timestamp("ns", tz="UTC"): "TIMESTAMPTZ_NS",
    pa.list_(pa.int8()): "TINYINT[]",
    pa.list_(pa.int32()): "INTEGER[]",
    pa.list_(pa.float32()): "FLOAT[]",
}


@dataclass
class ReadReport:
    """Which files the view reads, and which were skipped and why."""

    files: list[Path] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)


def list_span_files(root: str | os.PathLike[str]) -> list[Path]:
    """Every committed ``*.parquet`` under ``root`` (temporary and hidden files excluded), sorted."""
    base = Path(root)
    if not base.is_dir():
        return []
    return sorted(
        p
        for p in base.rglob("*.parquet")
        if not p.name.startswith((TEMP_PREFIX, "_"))
        and not any(part.startswith(("_", ".")) for part in p.relative_to(base).parts[:-1])
    )


def check_file(path: Path) -> str | None:
    """None if ``path`` is a readable Parquet file with span ids, else why not."""
    try:
        names = set(pq.read_metadata(path).schema.names)
    except Exception as exc:
        return f"unreadable Parquet: {exc}"
    missing = {"trace_id", "span_id"} - names
    return f"not a spans file: missing columns {sorted(missing)}" if missing else None


def empty_spans_sql() -> str:
    """A SELECT with the spans schema (plus partition/filename columns) and no rows."""
    columns = [f"CAST(NULL AS {_DUCKDB_TYPES[f.type]}) AS {identifier(f.name)}" for f in spans_schema()]
    columns += [f"CAST(NULL AS {t}) AS {identifier(n)}" for n, t in EXTRA_COLUMNS.items()]
    return f"SELECT {', '.join(columns)} WHERE false"


def open_spans(
    con: duckdb.DuckDBPyConnection,
    root: str | os.PathLike[str],
    view: str = "spans",
    files: Sequence[Path] | None = None,
) -> ReadReport:
    """Create (or replace) view ``view`` over all valid span files under ``root``, or over just
    ``files`` (the only files then checked and bound: the cost follows them, not the folder)."""
    report = ReadReport()
    superseded = superseded_inputs(Path(root))  # inputs of a compaction that is finishing right now
    for path in list_span_files(root) if files is None else files:
        if path in superseded or not path.exists():  # a given file compacted away since it was listed
            continue
        problem = check_file(path)
        if problem is None:
            report.files.append(path)
        else:
            report.skipped.append((path, problem))
    if not report.files:
        con.execute(f"CREATE OR REPLACE VIEW {identifier(view)} AS {empty_spans_sql()}")
        return report
    file_list = ", ".join(literal(str(p)) for p in report.files)
    con.execute(
        f"CREATE OR REPLACE VIEW {identifier(view)} AS SELECT *, {_partition_columns()} FROM read_parquet("
        f"[{file_list}], hive_partitioning = false, union_by_name = true, filename = true)"
    )
    return report


def _partition_columns() -> str:
    """SQL: the ``date=``/``hour=`` folder values of each row's file, null for a file outside such
    folders (DuckDB's own hive reading refuses a folder mixing flat and partitioned files)."""
    return ", ".join(
        f"TRY_CAST(NULLIF(regexp_extract(filename, '[/\\\\]{k}=([^/\\\\]+)[/\\\\]', 1), '') AS {t}) "
        f"AS {identifier(k)}"
        for k, t in HIVE_TYPES.items()
    )
