"""Merge the small span files of closed partitions into large ones, atomically and without duplicates.

Protocol per merge: (1) write a journal ``<root>/_compact/<id>.json`` naming the output and inputs,
(2) write the merged output (temp + fsync + rename), (3) delete the inputs, (4) delete the journal.
Readers (:func:`tinkertrace.spanstore.reader.open_spans`) ignore the inputs of any journal whose output
exists, so they never see a row twice; a crash is rolled forward by the next compaction. Files still
covered by a live collector WAL segment are left alone (the collector may replace them on recovery).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tinkertrace.durable import fsync_path
from tinkertrace.spanstore.writer import TEMP_PREFIX, ZSTD_LEVEL, write_parquet_atomic

JOURNAL_DIR = "_compact"
WAL_DIR = "_wal"


@dataclass
class CompactReport:
    merged_files: int = 0
    output_files: int = 0
    rows: int = 0
    partitions: list[str] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    rolled_forward: int = 0


def journals(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Readable compaction journals under ``root``."""
    folder = root / JOURNAL_DIR
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            found.append((path, json.loads(path.read_text())))
        except (OSError, ValueError):
            continue
    return found


def superseded_inputs(root: Path) -> set[Path]:
    """Input files of finished-but-not-cleaned merges: readers must skip them."""
    hidden: set[Path] = set()
    for _, entry in journals(root):
        if (root / str(entry["output"])).exists():
            hidden.update(root / str(p) for p in entry["inputs"])
    return hidden


def live_wal_tags(root: Path) -> set[str]:
    """``<instance>-<segment>`` prefixes of WAL segments that still exist under ``root/_wal``."""
    tags: set[str] = set()
    wal_root = root / WAL_DIR
    for instance in wal_root.iterdir() if wal_root.is_dir() else []:
        for segment in instance.glob("*.wal"):
            tags.add(f"{instance.name}-{segment.stem}")
    return tags


def _roll_forward(root: Path, report: CompactReport) -> None:
    for path, entry in journals(root):
        if (root / str(entry["output"])).exists():
            for name in entry["inputs"]:
                (root / str(name)).unlink(missing_ok=True)
        path.unlink()
        report.rolled_forward += 1


def _closed_partitions(root: Path, grace: timedelta) -> list[Path]:
    now = datetime.now(UTC)
    closed = []
    for hour_dir in sorted(root.glob("date=*/hour=*")):
        try:
            start = datetime.strptime(f"{hour_dir.parent.name[5:]} {hour_dir.name[5:]}", "%Y-%m-%d %H")
        except ValueError:
            continue
        if start.replace(tzinfo=UTC) + timedelta(hours=1) + grace <= now:
            closed.append(hour_dir)
    return closed


def compact(
    root: str | os.PathLike[str],
    *,
    small_file_bytes: int = 64 * 1024 * 1024,
    target_file_bytes: int = 256 * 1024 * 1024,
    grace_s: float = 300.0,
    zstd_level: int = ZSTD_LEVEL,
) -> CompactReport:
    """Merge files under ``small_file_bytes`` in partitions closed for ``grace_s`` into ~target-size files
    compressed at ``zstd_level``."""
    base = Path(root)
    report = CompactReport()
    if not base.is_dir():
        return report
    (base / JOURNAL_DIR).mkdir(exist_ok=True)
    with open(base / JOURNAL_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one compaction at a time per folder
        _roll_forward(base, report)
        listed_at_ns = time.time_ns()
        live = live_wal_tags(base)
        for partition in _closed_partitions(base, timedelta(seconds=grace_s)):
            candidates = []
            for path in sorted(partition.glob("*.parquet")):
                if path.name.startswith(TEMP_PREFIX) or _wal_busy(path.name, live, listed_at_ns):
                    continue
                if path.stat().st_size < small_file_bytes:
                    candidates.append(path)
            if len(candidates) < 2:
                continue
            report.partitions.append(str(partition.relative_to(base)))
            for batch in _batches(candidates, target_file_bytes):
                _merge(base, partition, batch, report, zstd_level)
    return report


def _wal_busy(name: str, live: set[str], listed_at_ns: int) -> bool:
    """True for a collector file whose WAL segment is live or newer than the listing."""
    parts = name.rsplit("-", 2)
    if len(parts) != 3 or not parts[1].isdigit() or len(parts[1]) != 20:
        return False
    return f"{parts[0]}-{parts[1]}" in live or int(parts[1]) >= listed_at_ns


def _batches(paths: list[Path], target: int) -> list[list[Path]]:
    batches: list[list[Path]] = [[]]
    size = 0
    for path in paths:
        if batches[-1] and size + path.stat().st_size > target:
            batches.append([])
            size = 0
        batches[-1].append(path)
        size += path.stat().st_size
    return [b for b in batches if len(b) > 1]


def _merge(root: Path, partition: Path, batch: list[Path], report: CompactReport, zstd_level: int) -> None:
    tables: list[pa.Table] = []
    inputs: list[Path] = []
    for path in batch:
        try:
            tables.append(pq.read_table(path, partitioning=None))
            inputs.append(path)
        except Exception as exc:
            report.skipped.append((path, f"unreadable Parquet: {exc}"))
    if len(inputs) < 2:
        return
    merged = pa.concat_tables(tables, promote_options="default")
    output = partition / f"compact-{uuid.uuid4().hex[:16]}.parquet"
    journal = root / JOURNAL_DIR / f"{output.stem}.json"
    entry = {"output": str(output.relative_to(root)), "inputs": [str(p.relative_to(root)) for p in inputs]}
    tmp = journal.with_name(f"{TEMP_PREFIX}{journal.name}.tmp")
    with open(tmp, "w") as handle:
        json.dump(entry, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, journal)
    fsync_path(journal.parent)
    write_parquet_atomic(merged, output, zstd_level)
    for path in inputs:
        path.unlink()
    fsync_path(partition)
    journal.unlink()
    report.merged_files += len(inputs)
    report.output_files += 1
    report.rows += merged.num_rows
