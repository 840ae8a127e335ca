"""`tinkertrace spans compact` and `tinkertrace spans stats` on real Parquet folders."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import duckdb
from typer.testing import CliRunner

from tinkertrace.cli import collector_cmd, spans_cmd
from tinkertrace.cli.main import app
from tinkertrace.spanstore.compact import compact
from tinkertrace.spanstore.convert import request_to_table
from tinkertrace.spanstore.reader import open_spans
from tinkertrace.spanstore.samples import llm_request
from tinkertrace.spanstore.writer import ZSTD_LEVEL, PartitionedParquetWriter

T0 = 1_767_225_600_000_000_000  # 2026-01-01T00:00Z: long closed
HOUR_NS = 3_600_000_000_000


def _write_small_files(root: Path, prefix: str, seeds: range, at_ns: int) -> list[Path]:
    writer = PartitionedParquetWriter(root, file_prefix=prefix)
    files = []
    for seed in seeds:
        writer.write(request_to_table(llm_request(10, seed=seed, service=f"svc{seed % 2}"), at_ns).table)
        files += writer.flush()
    return files


def _count(root: Path) -> tuple[int, int, int]:
    con = duckdb.connect()
    report = open_spans(con, root)
    total, distinct = con.execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchone()
    return total, distinct, len(report.files)


def test_compact_merges_closed_partitions_without_duplicates(tmp_path: Path) -> None:
    _write_small_files(tmp_path, "sdk-a", range(6), T0)
    _write_small_files(tmp_path, "sdk-b", range(6, 9), T0 + HOUR_NS)
    # files of a collector WAL segment that still exists must stay untouched
    live_segment = 10**19
    (tmp_path / "_wal" / "c1").mkdir(parents=True)
    (tmp_path / "_wal" / "c1" / f"{live_segment:020d}.wal").write_bytes(b"")
    live = _write_small_files(tmp_path, f"c1-{live_segment:020d}", range(20, 22), T0)
    assert _count(tmp_path) == (110, 110, 11)
    report = compact(tmp_path)
    assert (report.merged_files, report.output_files, report.rows) == (9, 2, 90)
    assert all(path.exists() for path in live)
    assert _count(tmp_path) == (110, 110, 4)
    assert compact(tmp_path).merged_files == 0  # nothing left to merge


def test_readers_skip_inputs_of_an_interrupted_merge_and_compact_rolls_forward(tmp_path: Path) -> None:
    inputs = _write_small_files(tmp_path, "sdk", range(3), T0)
    merged = _write_small_files(tmp_path, "merged", range(3, 6), T0)  # stands in for the merge output
    journal = tmp_path / "_compact" / "x.json"
    journal.parent.mkdir()
    relative = [str(p.relative_to(tmp_path)) for p in inputs]
    journal.write_text(json.dumps({"output": str(merged[0].relative_to(tmp_path)), "inputs": relative}))
    assert _count(tmp_path) == (30, 30, 3)  # the three inputs are hidden: the output already holds them
    report = compact(tmp_path, small_file_bytes=1)  # roll forward only
    assert report.rolled_forward == 1 and not journal.exists()
    assert not any(p.exists() for p in inputs)


def test_cli_stats_and_compact(tmp_path: Path) -> None:
    _write_small_files(tmp_path, "sdk", range(4), T0)
    (tmp_path / "date=2026-01-01" / "hour=00" / "junk.parquet").write_bytes(b"not parquet")
    runner = CliRunner()
    result = runner.invoke(app, ["spans", "stats", str(tmp_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "2026-01-01 00" in result.output and "svc0" in result.output and "llm" in result.output
    assert "40 spans in 4 file(s)" in result.output and "skipped" in result.output
    result = runner.invoke(app, ["spans", "compact", str(tmp_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "compacted 4 files into 1 (40 rows)" in result.output
    assert "junk.parquet" in result.output


def test_cli_compact_zstd_level(tmp_path: Path) -> None:
    """``spans compact --zstd-level`` recompresses the merged file; both commands default to the writer's
    level."""
    sizes = {}
    for level in ("-7", "19"):
        root = tmp_path / f"level{level}"
        _write_small_files(root, "sdk", range(4), T0)
        result = CliRunner().invoke(app, ["spans", "compact", str(root), "--zstd-level", level])
        assert result.exit_code == 0 and "compacted 4 files into 1" in result.output, result.output
        sizes[level] = sum(path.stat().st_size for path in root.rglob("*.parquet"))
    assert sizes["19"] < 0.97 * sizes["-7"]
    for command in (spans_cmd.compact, collector_cmd.collector):
        assert inspect.signature(command).parameters["zstd_level"].default == ZSTD_LEVEL


def test_cli_compact_rejects_out_of_range_settings(tmp_path: Path) -> None:
    """``spans compact``'s options come from ``CompactSettings``: its checks, named as the options."""
    for args, problem in ((["--zstd-level", "23"], "--zstd-level must be in"),
                          (["--small-mb", "0"], "--small-mb must be positive")):  # fmt: skip
        result = CliRunner().invoke(app, ["spans", "compact", str(tmp_path), *args], env={"COLUMNS": "300"})
        assert result.exit_code == 2 and problem in result.output, result.output
