"""The build's inputs as DuckDB views: the span files (``spans_raw``) and the GenAI log records
(``logs``) under a spans folder; every file read of the builder's views is here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from tinkertrace import schemas
from tinkertrace.builder.views import Relation
from tinkertrace.spanstore.logs import LOGS_FOLDER
from tinkertrace.spanstore.reader import ReadReport, list_span_files, open_spans
from tinkertrace.spanstore.sql import literal_list

RAW_VIEW = "spans_raw"
LOGS_VIEW = "logs"


@dataclass(frozen=True)
class Sources:
    """The build's inputs: the span rows (``raw``), the GenAI event log records (``logs``) and the
    reader's report of the files read and skipped."""

    raw: Relation
    logs: Relation
    report: ReadReport


def open_sources(
    con: duckdb.DuckDBPyConnection, spans_dir: Path, files: tuple[Path, ...] | None = None
) -> Sources:
    """Create the views ``spans_raw`` (the valid span files under ``spans_dir``, or just ``files``) and
    ``logs`` (the log records under its ``_logs``); unreadable files are skipped and reported."""
    report = open_raw(con, spans_dir, files)
    report.skipped.extend(open_logs(con, spans_dir))
    return Sources(RAW_VIEW, LOGS_VIEW, report)


def open_logs(con: duckdb.DuckDBPyConnection, spans_dir: Path) -> list[tuple[Path, str]]:
    """Create the view ``logs`` (``schemas.logs()`` rows) over the log records the collector wrote
    under ``spans_dir/_logs``, empty when there are none; returns the unreadable files it skipped."""
    readable, skipped = [], []
    for path in list_span_files(Path(spans_dir) / LOGS_FOLDER):
        try:
            pq.read_metadata(path)
            readable.append(path)
        except (OSError, pa.ArrowException) as exc:
            skipped.append((path, f"unreadable log file: {exc}"))
    if readable:
        listing = literal_list(readable)
        con.execute(f"CREATE OR REPLACE VIEW {LOGS_VIEW} AS SELECT * FROM read_parquet([{listing}])")
    else:
        con.register("_no_logs", schemas.logs().empty_table())
        con.execute(f"CREATE OR REPLACE VIEW {LOGS_VIEW} AS SELECT * FROM _no_logs")
    return skipped


def open_raw(
    con: duckdb.DuckDBPyConnection, spans_dir: Path, files: tuple[Path, ...] | None = None
) -> ReadReport:
    """Create the raw view ``spans_raw`` over the valid span files under ``spans_dir``, or just
    ``files`` when given (corrupt ones skipped and reported)."""
    return open_spans(con, spans_dir, view=RAW_VIEW, files=files)
