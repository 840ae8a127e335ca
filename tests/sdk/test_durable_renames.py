"""Renames that survive a power loss: the file fsynced before, its folder after. A power loss cannot be
simulated here, so the tests record which descriptors ``os.fsync`` flushed (a folder's, a file's) and
when, around real renames of real files."""

from __future__ import annotations

import os
import socket
import stat
import time
from pathlib import Path

import pytest

from tinkertrace.durable import durable_rename
from tinkertrace.sdk.spool import Spool

Event = tuple[str, str]  # ("fsync-dir" | "fsync-file" | "rename", path)


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[Event]:
    """Every os.fsync (of a folder or a file, by its path) and os.rename, in order; both still run."""
    seen: list[Event] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd: int) -> None:
        info = os.fstat(fd)
        kind = "fsync-dir" if stat.S_ISDIR(info.st_mode) else "fsync-file"
        seen.append((kind, os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        seen.append(("rename", os.fspath(dst)))
        real_rename(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    return seen


def _after_last_rename(seen: list[Event]) -> list[Event]:
    last = max(i for i, (kind, _) in enumerate(seen) if kind == "rename")
    return seen[last + 1 :]


def test_durable_rename_fsyncs_the_file_before_and_both_folders_after(
    tmp_path: Path, events: list[Event]
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    src = tmp_path / "a" / "x.tmp"
    src.write_bytes(b"payload")
    dst = durable_rename(src, tmp_path / "b" / "x")
    assert dst.read_bytes() == b"payload" and not src.exists()
    assert events == [
        ("fsync-file", str(src)),
        ("rename", str(dst)),
        ("fsync-dir", str(tmp_path / "b")),
        ("fsync-dir", str(tmp_path / "a")),
    ]


def test_durable_rename_of_a_file_taken_by_another_process_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        durable_rename(tmp_path / "gone", tmp_path / "claimed")


def test_spool_put_is_durable(tmp_path: Path, events: list[Event]) -> None:
    spool = Spool(tmp_path / "spool")
    events.clear()
    path = spool.put(b"request", n_spans=3)
    kinds = [kind for kind, _ in events]
    assert kinds == ["fsync-file", "rename", "fsync-dir"], events  # the data, then the folder's entry
    assert events[-1] == ("fsync-dir", str(spool.root))
    assert spool.pending() == [path]


def test_spool_claim_release_and_reject_are_durable(tmp_path: Path, events: list[Event]) -> None:
    spool = Spool(tmp_path / "spool")
    path = spool.put(b"request", n_spans=3)
    events.clear()
    claimed = spool.claim(path)
    assert claimed is not None
    assert _after_last_rename(events) == [("fsync-dir", str(spool.root))]
    events.clear()
    spool.release(claimed)
    assert _after_last_rename(events) == [("fsync-dir", str(spool.root))]
    claimed = spool.claim(path)
    assert claimed is not None
    events.clear()
    spool.reject(claimed)  # moved to another folder: both folders' entries changed
    assert _after_last_rename(events) == [
        ("fsync-dir", str(spool.rejected_dir)),
        ("fsync-dir", str(spool.root)),
    ]
    assert [p.name for p in spool.rejected_dir.iterdir()] == [path.name]


def test_spool_releasing_a_dead_process_claim_is_durable(tmp_path: Path, events: list[Event]) -> None:
    spool = Spool(tmp_path / "spool")
    path = spool.put(b"request", n_spans=1)
    dead = path.with_name(path.name + f".claim-{socket.gethostname()}-999999999")  # no such pid
    os.rename(path, dead)
    events.clear()
    assert spool.release_stale_claims() == 1
    assert events[-2:] == [("rename", str(path)), ("fsync-dir", str(spool.root))]


def test_the_journal_spools_what_a_collector_cannot_take_durably(tmp_path: Path, events: list[Event]) -> None:
    """The endpoint's journal replays a segment to a collector that is down: the spans wait in the
    spool, renamed into it durably (journal.py itself renames nothing: its segments are created, synced
    and their folder fsynced by the WAL, its Parquet written by the writer, which fsyncs its folder)."""
    from tinkertrace.collector.wal import WriteAheadLog
    from tinkertrace.sdk.config import TraceSettings
    from tinkertrace.sdk.export import ExportStats
    from tinkertrace.sdk.runtime import private_runtime
    from tinkertrace.serving.journal import SPANS, Journal
    from tinkertrace.serving.journal_delivery import JournalStats
    from tinkertrace.serving.journal_targets import CollectorTarget

    with socket.socket() as probe:  # a port nothing listens on: the collector is down
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    folder, spool = tmp_path / "journal", tmp_path / "spool"
    wal = WriteAheadLog(folder)
    wal.open_segment()
    wal.append(SPANS + _otlp_request(), time.time_ns())
    wal.sync()
    wal.close_segment()
    config = TraceSettings(endpoint=f"http://127.0.0.1:{port}", spool_dir=spool, export_timeout_s=1.0)
    stats = JournalStats()
    journal = Journal(folder, [CollectorTarget(config, ExportStats())], stats)
    events.clear()
    journal.recover(private_runtime(sink=journal, spans_dir=tmp_path / "unused"))
    journal.start()
    journal.shutdown()
    spooled = sorted(spool.glob("*.otlp"))
    assert len(spooled) == 1, sorted(spool.iterdir())
    put = events.index(("rename", str(spooled[0])))
    assert events[put - 1][0] == "fsync-file" and events[put + 1] == ("fsync-dir", str(spool))


def _otlp_request() -> bytes:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import SpanContext, TraceFlags

    from tinkertrace.sdk.export import ExportStats, encode_batch

    span = ReadableSpan(
        "chat m",
        context=SpanContext(0xABC, 0x1234, False, TraceFlags(TraceFlags.SAMPLED)),
        resource=Resource.create({"service.name": "t"}),
        start_time=time.time_ns(),
        end_time=time.time_ns(),
    )
    request = encode_batch([span], ExportStats())
    assert request is not None
    return request.SerializeToString()
