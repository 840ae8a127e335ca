"""Acceptance: crash recovery (kill -9), bad input, overload, on a real collector process or app."""

from __future__ import annotations

import errno
import fcntl
import gzip
import os
import signal
import struct
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from google.rpc import status_pb2

from tinkertrace.collector.http_server import HttpServer
from tinkertrace.collector.ingest import IngestConfig, Ingestor, Unavailable, file_tag
from tinkertrace.collector.otlp_http import OtlpHttpHandler
from tinkertrace.collector.wal import (
    BLOCK,
    MAGIC,
    STAGE_BYTES,
    UnknownFormat,
    WriteAheadLog,
    holds_records,
    read_segment,
    segment_ids,
)
from tinkertrace.netutil import free_port
from tinkertrace.spanstore import writer as writer_module
from tinkertrace.spanstore.convert import request_to_table
from tinkertrace.spanstore.samples import llm_request
from tinkertrace.spanstore.writer import PartitionedParquetWriter
from tinkertrace.testing.signals import CAN_SIGNAL_THREADS, signal_other_thread

PROTOBUF = {"content-type": "application/x-protobuf"}


def _span_ids(request: Any) -> set[str]:
    return {s.span_id.hex() for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans}


@pytest.mark.slow
def test_kill_9_after_acks_loses_nothing_and_duplicates_nothing(
    start_collector: Callable[..., Any],
) -> None:
    collector = start_collector("--roll-seconds", "0.3")
    acknowledged: set[str] = set()
    with httpx.Client() as client:
        for seed in range(24):
            request = llm_request(50, seed=seed, prompt_tokens=64, response_tokens=16)
            response = client.post(collector.url, content=request.SerializeToString(), headers=PROTOBUF)
            assert response.status_code == 200
            acknowledged |= _span_ids(request)
            time.sleep(0.03)  # spread over several WAL segments, some flushed, some not
    collector.kill()
    restarted = start_collector(out=collector.out)
    output = restarted.stop()
    stored = restarted.query("SELECT span_id, count(*) FROM spans GROUP BY span_id")
    assert {span_id for span_id, _ in stored} == acknowledged
    assert max(count for _, count in stored) == 1
    assert segment_ids(collector.out / "_wal" / "test") == []
    assert "stopped;" in output


@pytest.mark.skipif(not CAN_SIGNAL_THREADS, reason="Linux's tgkill")
def test_a_sigterm_another_thread_receives_still_stops_the_collector(
    start_collector: Callable[..., Any],
) -> None:
    """The kernel may hand a process's SIGTERM to any of its threads; Python runs the handler in the
    main thread only when it wakes. Sent to a gRPC or writer thread, it once left the collector running
    until SIGKILL (a fresh-clone suite timed out on it)."""
    collector = start_collector("--roll-seconds", "0.3")
    signal_other_thread(collector.proc.pid, signal.SIGTERM)
    output, _ = collector.proc.communicate(timeout=20)
    assert collector.proc.returncode == 0, output
    assert "stopped;" in output


def test_recovery_replaces_partial_files_of_a_segment(tmp_path: Path) -> None:
    """A segment whose Parquet was half written before a crash is replayed without duplicates."""
    out, wal_dir = tmp_path / "spans", tmp_path / "spans" / "_wal" / "c1"
    requests = [llm_request(20, seed=s) for s in range(3)]
    wal = WriteAheadLog(wal_dir)
    segment = wal.open_segment()
    for request in requests:
        wal.append(request.SerializeToString(), 1_767_225_600_000_000_000)
    wal.sync()
    wal.close_segment()
    with open(wal.dir / f"{segment:020d}.wal", "r+b") as torn:  # after the last record (and over any padding)
        torn.seek(len(MAGIC) + wal.segment_bytes)
        torn.write(b"\x10\x00\x00\x00garbage")  # a record cut short by the crash: never acknowledged
    # before the crash the writer had already written the first request of this segment
    partial = PartitionedParquetWriter(out, file_prefix=file_tag("c1", segment))
    partial.write(request_to_table(requests[0], 1_767_225_600_000_000_000).table)
    partial.close()
    ingestor = Ingestor(IngestConfig(out=out, wal_dir=wal_dir, instance="c1"))
    report = ingestor.recover()
    assert (report.segments, report.records, report.spans, report.files_replaced) == (1, 3, 60, 1)
    assert "torn" in report.notes[0]
    import duckdb

    from tinkertrace.spanstore.reader import open_spans

    con = duckdb.connect()
    open_spans(con, out)
    assert con.execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchone() == (60, 60)
    assert segment_ids(wal_dir) == []


def open_wal(path: Path, direct: bool) -> WriteAheadLog:
    """A WAL with a fresh segment, skipping the test if ``direct`` is asked where O_DIRECT is refused."""
    wal = WriteAheadLog(path, direct=direct)
    wal.open_segment()
    if direct and not wal.direct:
        pytest.skip(f"the file system of {path} refuses O_DIRECT")
    return wal


@pytest.mark.parametrize("direct", [True, False], ids=["o_direct", "buffered"])
def test_wal_reads_its_crc32c_records_and_refuses_other_formats(tmp_path: Path, direct: bool) -> None:
    wal = open_wal(tmp_path, direct)
    wal.append(b"first", 1)
    wal.append(b"second", 2)
    wal.sync()
    wal.close_segment()
    path = tmp_path / f"{wal.segment:020d}.wal"
    data = path.read_bytes()
    assert data.startswith(MAGIC)
    records, note = read_segment(path)
    assert [(r.received_at_ns, r.payload) for r in records] == [
        (1, b"first"),
        (2, b"second"),
    ] and note is None
    end = len(MAGIC) + wal.segment_bytes
    assert len(data) == (-(-end // BLOCK) * BLOCK if direct else end)  # O_DIRECT pads the last block
    path.write_bytes(data[: end - 1] + bytes([data[end - 1] ^ 1]) + data[end:])  # a flipped payload bit
    records, note = read_segment(path)
    assert [r.payload for r in records] == [b"first"] and "corrupt record" in str(note)
    path.write_bytes(MAGIC[:3])  # crash while the segment header was written: nothing was acknowledged
    assert read_segment(path) == ([], f"{path.name}: torn segment header dropped")
    legacy = tmp_path / "legacy.wal"
    legacy.write_bytes(_format_1_segment([b"a", b"bc"]))
    with pytest.raises(UnknownFormat, match=r"has no .* header"):
        read_segment(legacy)
    assert not holds_records(legacy)


def _format_1_segment(payloads: list[bytes]) -> bytes:
    """A segment as early versions wrote it: no magic, records <len><zlib crc32><ns><payload>."""
    return b"".join(struct.pack("<IIq", len(p), zlib.crc32(p), 7) + p for p in payloads)


def test_recovery_sets_a_segment_of_another_format_aside_and_replays_the_rest(tmp_path: Path) -> None:
    """A format-1 segment is neither misread nor deleted: renamed aside with a note, its files kept."""
    out, wal_dir = tmp_path / "spans", tmp_path / "spans" / "_wal" / "c1"
    wal_dir.mkdir(parents=True)
    old = wal_dir / f"{1:020d}.wal"
    old.write_bytes(_format_1_segment([llm_request(5, seed=1).SerializeToString()]))
    written_from_it = PartitionedParquetWriter(out, file_prefix=file_tag("c1", 1))
    written_from_it.write(request_to_table(llm_request(5, seed=1), 1_767_225_600_000_000_000).table)
    written_from_it.close()
    wal = WriteAheadLog(wal_dir)
    wal.open_segment()
    wal.append(llm_request(7, seed=2).SerializeToString(), 1_767_225_600_000_000_000)
    wal.sync()
    wal.close_segment()
    report = Ingestor(IngestConfig(out=out, wal_dir=wal_dir, instance="c1")).recover()
    assert (report.segments, report.spans, report.set_aside, report.files_replaced) == (1, 7, 1, 0)
    assert "not replayed" in report.notes[0] and old.name in report.notes[0]
    assert segment_ids(wal_dir) == [] and (wal_dir / f"{old.name}.unreadable").exists()
    assert written_from_it.files_written[0].exists()


@pytest.mark.parametrize("direct", [True, False], ids=["o_direct", "buffered"])
def test_wal_batches_of_any_size_replay_exactly(tmp_path: Path, direct: bool) -> None:
    """Batches end anywhere in a block (O_DIRECT rewrites the last block, completed, with the next
    batch), and records larger than the staging memory are written in pieces."""
    wal = open_wal(tmp_path, direct)
    rng = np.random.default_rng(0)
    sizes = [[1], [BLOCK - 16], [3, 5000, 17], [STAGE_BYTES + 12_345], [BLOCK], [70_000] * 80, [9]]
    batches = [[rng.bytes(size) for size in batch] for batch in sizes]
    for number, batch in enumerate(batches):
        for payload in batch:
            wal.append(payload, number)
        wal.sync()
        records, note = read_segment(tmp_path / f"{wal.segment:020d}.wal")  # what a crash now leaves
        assert note is None
        assert [r.payload for r in records] == [p for b in batches[: number + 1] for p in b]
    wal.close_segment()
    path = tmp_path / f"{wal.segment:020d}.wal"
    records, note = read_segment(path)
    assert [(r.received_at_ns, r.payload) for r in records] == [
        (number, p) for number, batch in enumerate(batches) for p in batch
    ] and note is None
    if direct:  # a crash mid-batch left new bytes beyond the padding: they were never acknowledged
        with path.open("ab") as torn:
            torn.write(b"\x01" * 100)
        records, note = read_segment(path)
        assert len(records) == sum(map(len, batches)) and "torn data after the padding" in str(note)
    with pytest.raises(ValueError, match="needs a payload"):
        wal.append(b"", 0)


@pytest.mark.parametrize("refused_by", ["open", "write"])
def test_wal_writes_plainly_where_o_direct_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused_by: str
) -> None:
    """A file system that refuses O_DIRECT (tmpfs, some network file systems) at open or only at the
    first write gets plain writes, and loses nothing."""
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this platform")
    real_open, real_pwrite = os.open, os.pwrite

    def refusing_open(path: Any, flags: int, *args: Any) -> int:
        if refused_by == "open" and flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    def refusing_pwrite(fd: int, data: Any, offset: int) -> int:
        if refused_by == "write" and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "open", refusing_open)
    monkeypatch.setattr(os, "pwrite", refusing_pwrite)
    wal = WriteAheadLog(tmp_path)
    for first in (b"one", b"three"):  # two segments: the second starts plain at once
        wal.open_segment()
        wal.append(first, 1)
        wal.append(b"two", 2)
        wal.sync()
        wal.close_segment()
        assert not wal.direct
        records, note = read_segment(tmp_path / f"{wal.segment:020d}.wal")
        assert [r.payload for r in records] == [first, b"two"] and note is None


@pytest.mark.slow
def test_bad_input_is_answered_and_good_data_still_accepted(start_collector: Callable[..., Any]) -> None:
    collector = start_collector("--token", "s3cret", "--max-request-mb", "0.05")
    auth = {**PROTOBUF, "authorization": "Bearer s3cret"}
    good = llm_request(10, seed=1, prompt_tokens=32, response_tokens=8).SerializeToString()
    big = llm_request(200, seed=2).SerializeToString()
    json_auth = {"content-type": "application/json", "authorization": "Bearer s3cret"}
    cases: list[tuple[str, bytes, dict[str, str], int, str]] = [
        ("no token", good, PROTOBUF, 401, "missing bearer token"),
        ("wrong token", good, {**PROTOBUF, "authorization": "Bearer nope"}, 401, "wrong bearer token"),
        ("garbage", b"\xff\xfe not protobuf", auth, 400, "not a valid OTLP protobuf"),
        ("truncated", good[: len(good) // 2], auth, 400, "not a valid OTLP protobuf"),
        ("bad gzip", b"\x1f\x8b\x08 nope", {**auth, "content-encoding": "gzip"}, 400, "not valid gzip"),
        ("not json", b"{oops", json_auth, 400, "not valid JSON"),
        ("wrong json", b'{"resourceSpans": 5}', json_auth, 400, "not an OTLP ExportTraceServiceRequest"),
        (
            "bad hex",
            b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"zz"}]}]}]}',
            json_auth,
            400,
            "not hex",
        ),
        ("content type", good, {**auth, "content-type": "text/plain"}, 415, "unsupported content type"),
        ("oversize", big, auth, 413, "over the"),
        ("oversize gzip", gzip.compress(big), {**auth, "content-encoding": "gzip"}, 413, "over the"),
    ]
    with httpx.Client() as client:
        for label, body, headers, status, message in cases:
            response = client.post(collector.url, content=body, headers=headers)
            assert response.status_code == status, label
            if headers.get("content-type") == "application/json":
                assert message in response.json()["message"], label
            elif status != 415:
                assert message in status_pb2.Status.FromString(response.content).message, label
            else:
                assert message in response.text, label
        assert client.get(collector.url).status_code == 405
        with grpc.insecure_channel(collector.grpc_target) as channel:
            export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
            with pytest.raises(grpc.RpcError) as unauthenticated:
                export(good)
            assert unauthenticated.value.code() == grpc.StatusCode.UNAUTHENTICATED
            with pytest.raises(grpc.RpcError) as invalid:
                export(b"\xff\xfe", metadata=(("authorization", "Bearer s3cret"),))
            assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert export(good, metadata=(("authorization", "Bearer s3cret"),)) == b""
        assert client.post(collector.url, content=good, headers=auth).status_code == 200
        health = client.get(collector.url.replace("/v1/traces", "/health")).json()
        assert health["status"] == "ok" and health["spans"] == 20
    collector.stop()
    assert collector.query("SELECT count(*), count(DISTINCT span_id) FROM spans") == [(20, 10)]


def test_overload_answers_429_with_retry_after_then_recovers(tmp_path: Path) -> None:
    out = tmp_path / "spans"
    ingestor = Ingestor(IngestConfig(out=out, wal_dir=out / "_wal" / "x", instance="x", max_queue_bytes=1000))
    body = llm_request(5, seed=1).SerializeToString()
    filler = request_to_table(llm_request(5, seed=9), 1_767_225_600_000_000_000)
    backlog: Future[None] = ingestor.submit(b"x" * 2000, filler, 1_767_225_600_000_000_000)  # fills the queue
    handler = OtlpHttpHandler(ingestor, max_request_bytes=1 << 20)
    server = HttpServer(handler, "127.0.0.1", free_port(), max_body_bytes=1 << 20)
    server.start()
    with httpx.Client() as client:
        url = f"http://127.0.0.1:{server.port}/v1/traces"
        refused = client.post(url, content=body, headers=PROTOBUF)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert "queue is full" in status_pb2.Status.FromString(refused.content).message
        ingestor.start()  # the WAL and writer threads drain the backlog
        backlog.result(timeout=10)
        deadline = time.monotonic() + 10
        while ingestor.pending_bytes and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.post(url, content=body, headers=PROTOBUF).status_code == 200
    server.stop()
    ingestor.stop()
    assert ingestor.stats["overloaded"] == 1 and ingestor.writer.rows_written == 10
    assert isinstance(filler.table, pa.Table)


def test_a_failing_wal_answers_every_queued_request_and_refuses_new_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests queued behind a WAL write that fails get Unavailable (HTTP 503) instead of no answer;
    while it keeps failing, new ones are refused before their bodies are read."""
    out = tmp_path / "spans"
    ingestor = Ingestor(IngestConfig(out=out, wal_dir=out / "_wal" / "x", instance="x"))
    syncing, release = threading.Event(), threading.Event()

    def failing_sync() -> None:
        syncing.set()
        release.wait(10)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ingestor.wal, "sync", failing_sync)
    result = request_to_table(llm_request(5, seed=1), 1_767_225_600_000_000_000)
    ingestor.start()
    first = ingestor.submit(b"first", result, 1_767_225_600_000_000_000)
    assert syncing.wait(10)  # the WAL thread is inside the failing fsync; these wait in its queue
    queued = [ingestor.submit(b"queued", result, 1_767_225_600_000_000_000) for _ in range(3)]
    release.set()
    for future in [first, *queued]:
        with pytest.raises(Unavailable, match="No space left on device"):
            future.result(timeout=10)
    with pytest.raises(Unavailable, match="No space left on device"):
        ingestor.admit(100)
    assert ingestor.health()["status"] == "recovering"
    assert ingestor.pending_bytes == 0
    ingestor.stop()


@pytest.mark.skipif(
    pa.default_memory_pool().backend_name != "mimalloc", reason="pyarrow built without mimalloc"
)
@pytest.mark.parametrize(("given", "expected"), [(None, "60000"), ("250", "250")])
def test_collector_keeps_freed_arrow_memory_for_a_minute(
    start_collector: Callable[..., Any], given: str | None, expected: str
) -> None:
    """The collector process sets mimalloc's purge delay before pyarrow loads; a value set by the user
    wins. mimalloc prints the options it runs with when MIMALLOC_VERBOSE is set."""
    env = {"MIMALLOC_VERBOSE": "1"} | ({"MIMALLOC_PURGE_DELAY": given} if given else {})
    collector = start_collector(env=env)
    assert httpx.get(f"http://127.0.0.1:{collector.http_port}/health").status_code == 200
    output = collector.stop()
    assert f"option 'purge_delay': {expected}" in output


def test_transient_storage_errors_are_retried_and_the_collector_recovers_without_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Too many open files for the WAL, then a full disk for the Parquet writer: the requests hit are
    refused with 503 (clients retry), /health says what happened, and once the errors clear every
    acknowledged span is in Parquet, with no restart."""
    out = tmp_path / "spans"
    ingestor = Ingestor(IngestConfig(out=out, wal_dir=out / "_wal" / "x", instance="x"))
    failures = {"open": 2, "parquet": 2}
    open_segment, write_file = ingestor.wal.open_segment, writer_module.write_parquet_atomic

    def crowded_open() -> int:
        if failures["open"]:
            failures["open"] -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return open_segment()

    def full_disk(*args: Any, **kwargs: Any) -> None:
        if failures["parquet"]:
            failures["parquet"] -= 1
            raise OSError(errno.ENOSPC, "No space left on device")
        write_file(*args, **kwargs)

    monkeypatch.setattr(ingestor.wal, "open_segment", crowded_open)
    monkeypatch.setattr(writer_module, "write_parquet_atomic", full_disk)
    ingestor.start()
    received = 1_767_225_600_000_000_000
    deadline = time.monotonic() + 10
    while ingestor.stats["storage_errors"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    health = ingestor.health()
    assert health["status"] == "recovering" and "Too many open files" in health["storage_errors_now"][0]
    acknowledged: list[Any] = []
    for seed in range(40):  # as a client would: retry what gets 503 until it is acknowledged
        request = llm_request(3, seed=seed)
        while True:
            try:
                ingestor.admit(0)
                ingestor.submit(
                    request.SerializeToString(), request_to_table(request, received), received
                ).result(10)
                break
            except Unavailable:
                time.sleep(0.02)
        acknowledged.append(request)
        time.sleep(0.01)
    deadline = time.monotonic() + 15
    while (failures["parquet"] or ingestor.troubles) and time.monotonic() < deadline:
        time.sleep(0.05)
    health = ingestor.health()
    ingestor.stop()
    assert health["status"] == "ok" and health["storage_recoveries"] >= 2
    assert "No space left on device" in health["last_storage_error"]
    assert ingestor.failure is None and failures == {"open": 0, "parquet": 0}
    stored = (
        pa.concat_tables([pq.read_table(f) for f in out.rglob("*.parquet")]).column("span_id").to_pylist()
    )
    assert sorted(stored) == sorted(i for r in acknowledged for i in _span_ids(r))
    assert not list(out.rglob(".*tmp")) and segment_ids(out / "_wal" / "x") == []
