"""SDK test helpers: a fresh tinkertrace configuration per test and a DuckDB view of its spans."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

import tinkertrace
from tinkertrace.spanstore.reader import open_spans

ALL_COLUMNS = (
    "* replace (epoch_ns(start_time) as start_time, epoch_ns(end_time) as end_time,"
    " epoch_ns(received_at) as received_at)"
)


class Traced:
    """The spans folder of one test, readable after a flush."""

    def __init__(self, spans_dir: Path) -> None:
        self.spans_dir = spans_dir

    def rows(self, where: str = "true", columns: str = ALL_COLUMNS) -> list[dict[str, Any]]:
        """Rows of the spans view (times as epoch nanoseconds), oldest first."""
        assert tinkertrace.flush()
        con = duckdb.connect()
        report = open_spans(con, self.spans_dir)
        assert not report.skipped
        rel = con.sql(f"select {columns} from spans where {where} order by start_time")
        return rel.to_arrow_table().to_pylist()


@pytest.fixture
def trace_init(tmp_path: Path) -> Iterator[Callable[..., Traced]]:
    """``trace_init(**init_options)``: ``tinkertrace.init`` with the embedded sink in a temporary
    folder (and a temporary spool); shut down after the test."""

    def start(**options: Any) -> Traced:
        spans = tmp_path / "spans"
        tinkertrace.init(spans_dir=spans, spool_dir=tmp_path / "spool", **options)
        return Traced(spans)

    yield start
    tinkertrace.shutdown()


@pytest.fixture
def traced(trace_init: Callable[..., Traced]) -> Traced:
    """Tracing with default options into a temporary spans folder."""
    return trace_init()
