"""Acknowledged spans are in Parquet within about a second under light load (the idle flush), and the
readers say when a collector's WAL still holds spans that are not in Parquet yet."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from tinkertrace.cli.main import app
from tinkertrace.collector.wal import WriteAheadLog, unflushed_wal_note
from tinkertrace.spanstore.samples import llm_request


@pytest.mark.slow
def test_an_acknowledged_request_is_queryable_within_about_a_second(
    start_collector: Callable[..., Any],
) -> None:
    collector = start_collector()  # the default --roll-seconds 30
    for round_ in range(2):  # the second request goes to a new WAL segment after the idle flush
        request = llm_request(5, seed=round_)
        response = httpx.post(
            collector.url,
            content=request.SerializeToString(),
            headers={"content-type": "application/x-protobuf"},
        )
        assert response.status_code == 200
        acknowledged = time.monotonic()
        expected = 5 * (round_ + 1)
        while collector.query("SELECT count(*) FROM spans") != [(expected,)]:
            assert time.monotonic() - acknowledged < 2.0, "spans not in Parquet 2 s after the acknowledgement"
            time.sleep(0.05)
        assert unflushed_wal_note(collector.out) is None
    collector.stop()


def test_readers_say_when_a_wal_holds_spans_not_in_parquet_yet(tmp_path: Path) -> None:
    spans = tmp_path / "spans"
    wal = WriteAheadLog(spans / "_wal" / "host-4318")
    wal.open_segment()
    wal.sync()  # the segment header only: nothing acknowledged
    assert unflushed_wal_note(spans) is None
    wal.append(llm_request(2, seed=1).SerializeToString(), time.time_ns())
    wal.sync()
    note = unflushed_wal_note(spans)
    assert note is not None and "host-4318" in note and "not in Parquet yet" in note
    runner = CliRunner()
    result = runner.invoke(
        app, ["spans", "query", str(spans), "SELECT count(*) AS n FROM spans", "-f", "csv"]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines() == ["n", "0"] and "not in Parquet yet" in result.stderr
    wal.close_segment()
    wal.delete(wal.segment)
    assert unflushed_wal_note(spans) is None
