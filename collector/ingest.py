"""The collector's durable pipeline: convert → WAL (fsync, then acknowledge) → Parquet → drop the WAL.

A WAL thread appends each accepted request's raw protobuf bytes to the current segment, fsyncs a
whole batch at once (group commit), hands the converted tables to the writer thread in log order and
only then resolves the callers' futures. Parquet files carry their WAL segment in their name
(``<instance>-<segment>-<n>.parquet``); when a segment is closed the writer flushes, and only then is
the segment deleted. On start, every leftover segment is replayed after deleting the files that
carry its name, so a crash at any point leaves each acknowledged span in Parquet exactly once.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa

from tinkertrace.collector.budget import ADMIT_FACTOR, FILE_SHARE, WRITE_FACTOR, MemoryBudget
from tinkertrace.collector.settings import CollectorSettings, MiB
from tinkertrace.collector.storage_errors import RETRY_FIRST_S, RETRY_MAX_S, StorageTroubles
from tinkertrace.collector.wal import WriteAheadLog, iter_records
from tinkertrace.spanstore.convert import ConversionResult, body_to_table
from tinkertrace.spanstore.writer import TEMP_PREFIX, ZSTD_LEVEL, PartitionedParquetWriter

log = logging.getLogger("tinkertrace.collector")


class Overloaded(Exception):
    """The queue is full: the client should retry after ``retry_after_s``."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"collector queue is full; retry after {retry_after_s}s")
        self.retry_after_s = retry_after_s


class Unavailable(Exception):
    """The collector is shutting down or its storage failed."""


@dataclass
class IngestConfig:
    out: Path
    wal_dir: Path
    instance: str
    max_queue_bytes: int = int(CollectorSettings.max_queue_mb * MiB)
    max_file_bytes: int = int(CollectorSettings.max_file_mb * MiB)
    roll_seconds: float = CollectorSettings.roll_seconds
    idle_flush_s: float = 0.25  # a segment with records and no new request for this long goes to Parquet
    wal_segment_bytes: int = 256 * 1024 * 1024
    retry_after_s: int = 1
    zstd_level: int = ZSTD_LEVEL
    # request bytes -> table: spans (default) or another signal's converter (logs); replayed alike
    convert: Callable[[bytes, int], ConversionResult] = body_to_table


@dataclass
class RecoveryReport:
    segments: int = 0
    records: int = 0
    spans: int = 0
    files_replaced: int = 0
    set_aside: int = 0  # segments of another format, renamed and not replayed
    notes: list[str] = field(default_factory=list)


@dataclass
class _Item:
    payload: bytes  # the request, logged as one WAL record
    table: pa.Table
    received_at_ns: int
    cost: int
    future: Future[None]


_STOP = object()
_T = TypeVar("_T")
WAL, WRITER = "write-ahead log", "Parquet writer"  # the storage parts whose errors are retried


def name_os_thread() -> None:
    """Give the calling OS thread its Python thread's name (``top -H``, ``/proc/<pid>/task/*/comm``)."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the name is cosmetic
        ctypes.CDLL(None).prctl(15, threading.current_thread().name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


def file_tag(instance: str, segment: int) -> str:
    """The name prefix of the Parquet files holding a WAL segment's spans."""
    return f"{instance}-{segment:020d}"


def next_batch(source: queue.Queue[Any], wait_s: float, limit: int = 4096) -> list[Any]:
    """What is queued (up to ``limit`` items), waiting up to ``wait_s`` for the first: one group commit's
    worth."""
    try:
        batch = [source.get(timeout=wait_s)]
    except queue.Empty:
        return []
    while len(batch) < limit:
        try:
            batch.append(source.get_nowait())
        except queue.Empty:
            break
    return batch


def remove_segment_files(out: Path, tag: str) -> int:
    """Delete the Parquet files (and temporary files) tagged ``tag`` under ``out``, before the segment is
    replayed into new ones: what a crash left of them is replaced, so each span is stored once. Returns
    how many were deleted."""
    stale = [*out.rglob(f"{tag}-*.parquet"), *out.rglob(f"{TEMP_PREFIX}{tag}-*")]
    for path in stale:
        path.unlink()
    return len(stale)


class Ingestor:
    """Accepts converted requests durably; see the module docstring for the protocol."""

    def __init__(self, config: IngestConfig) -> None:
        self.config = config
        self.wal = WriteAheadLog(config.wal_dir)
        # a file is written at this many buffered bytes; its working memory is kept aside in the budget
        self.file_bytes = max(1, min(config.max_file_bytes, config.max_queue_bytes // FILE_SHARE))
        self.writer = PartitionedParquetWriter(
            config.out,
            max_file_bytes=self.file_bytes,
            max_file_age_s=max(config.roll_seconds * 2, 1.0),
            compression_level=config.zstd_level,
            splice_lists=True,  # the collector's fast writer of token lists (spanstore.list_splice)
        )
        self._wal_q: queue.Queue[Any] = queue.Queue()
        self._writer_q: queue.Queue[Any] = queue.Queue()
        self._lock = threading.Lock()
        self.budget = MemoryBudget(config.max_queue_bytes, int(WRITE_FACTOR * self.file_bytes))
        self._closing = False
        self.failure: str | None = None  # a bug stopped the storage threads: nothing is accepted any more
        self.stats: dict[str, Any] = {
            "requests": 0,
            "spans": 0,
            "rejected_spans": 0,
            "overloaded": 0,
            "files": 0,
            "converted_compiled": 0,  # requests by decoder (spanstore.convert)
            "converted_reference": 0,
            "compiled_fallbacks": {},  # why the compiled decoder declined, by reason
        }
        self.troubles = StorageTroubles(self.stats)  # storage errors being retried, by part (WAL, WRITER)
        self._threads = [
            threading.Thread(target=self._wal_loop, name="tt-wal", daemon=True),
            threading.Thread(target=self._writer_loop, name="tt-parquet", daemon=True),
        ]

    # --- start-up ------------------------------------------------------------------------------
    def recover(self) -> RecoveryReport:
        """Replay WAL segments left by a previous run into Parquet (exactly once), then delete them."""
        report = RecoveryReport()
        for segment, records, note in iter_records(self.config.wal_dir):
            if records is None:  # another format: its files stay as they are
                report.set_aside += 1
                report.notes.append(str(note))
                continue
            tag = file_tag(self.config.instance, segment)
            report.files_replaced += remove_segment_files(self.config.out, tag)
            self.writer.file_prefix = tag
            for record in records:
                result = self.config.convert(record.payload, record.received_at_ns)
                with self._lock:
                    self._count_decoder(result)
                self.writer.write(result.table)
                report.spans += result.accepted
            self.writer.flush()
            self.wal.delete(segment)
            report.segments += 1
            report.records += len(records)
            if note:
                report.notes.append(note)
        return report

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    # --- the request path ------------------------------------------------------------------------
    def check_capacity(self) -> None:
        """Raise :class:`Unavailable` / :class:`Overloaded` before a request is parsed."""
        if self.failure or self._closing:
            raise Unavailable(self.failure or "collector is shutting down")
        if WAL in self.troubles.now:
            raise Unavailable(f"{self.troubles.now[WAL]}; retrying")
        if self.budget.full:
            self.stats["overloaded"] += 1
            raise Overloaded(self.config.retry_after_s)

    def admit(self, nbytes: int) -> int:
        """Reserve the memory budget for a body of ``nbytes`` about to be received and its converted table
        (``ADMIT_FACTOR`` x ``nbytes``); returns the bytes reserved. Raises :class:`Unavailable` /
        :class:`Overloaded` (before the body is read)."""
        self.check_capacity()
        reserved = ADMIT_FACTOR * nbytes
        if not self.budget.try_reserve(reserved):
            self.stats["overloaded"] += 1
            raise Overloaded(self.config.retry_after_s)
        return reserved

    def count_request(self, result: ConversionResult | None = None) -> None:
        """Count one request (``None``: an empty one) and how it was converted."""
        with self._lock:
            self.stats["requests"] += 1
            if result is not None:
                self.stats["rejected_spans"] += result.rejected
                self._count_decoder(result)

    def _count_decoder(self, result: ConversionResult) -> None:
        """Count which decoder converted a request (replayed ones too) and why it was not the compiled one."""
        self.stats[f"converted_{result.decoder}"] += 1
        if result.fallback is not None:
            fallbacks = self.stats["compiled_fallbacks"]
            fallbacks[result.fallback] = fallbacks.get(result.fallback, 0) + 1

    def submit(
        self, payload: bytes, result: ConversionResult, received_at_ns: int, *, reserved: int = 0
    ) -> Future[None]:
        """Queue one converted request (``result`` is its spans); the future resolves once its bytes are
        fsynced in the WAL. ``reserved`` bytes already taken from the budget for it pass to the queue."""
        future: Future[None] = Future()
        cost = len(payload) + result.table.get_total_buffer_size()
        self.count_request(result)
        if result.accepted == 0:
            self.budget.release(reserved)
            future.set_result(None)
            return future
        with self._lock:
            if self.failure or self._closing:
                raise Unavailable(self.failure or "collector is shutting down")
            self.budget.reserve(cost - reserved)
            self.stats["spans"] += result.accepted
            # queued under the lock: once the WAL has failed, _refuse_queued finds every item queued
            self._wal_q.put(_Item(payload, result.table, received_at_ns, cost, future))
        return future

    @property
    def pending_bytes(self) -> int:
        return self.budget.used

    def health(self) -> dict[str, Any]:
        """Status (``ok``, ``recovering`` from a storage error, ``failed``), what happened, and counts."""
        with self._lock:
            fallbacks = dict(self.stats["compiled_fallbacks"])
        return {
            "status": "failed" if self.failure else "recovering" if self.troubles else "ok",
            "failure": self.failure,
            "storage_errors_now": sorted(self.troubles.now.values()),
            "last_storage_error": self.troubles.last,
            "pending_bytes": self.budget.used,
            "budget_bytes": self.budget.limit,
            "write_reserve_bytes": self.budget.write_reserve,
            **self.stats,
            "compiled_fallbacks": fallbacks,
        }

    # --- shutdown --------------------------------------------------------------------------------
    def stop(self, timeout: float = 60.0) -> None:
        """Stop accepting, write everything queued to Parquet, delete the flushed WAL segments."""
        with self._lock:  # submit() queues under it: nothing is queued after the stop
            self._closing = True
            self._wal_q.put(_STOP)
        for thread in self._threads:
            thread.join(timeout)

    # --- threads ---------------------------------------------------------------------------------
    def _wal_loop(self) -> None:
        """Log batches (group commit); roll the segment when full, old, idle, or at the stop. A storage
        error (``OSError``: too many open files, disk full, ...) refuses the batch it hit with
        :class:`Unavailable`, closes the segment (its acknowledged records still go to Parquet) and
        retries opening a new one with backoff until it works; meanwhile requests get 503."""
        name_os_thread()
        cfg = self.config
        retry_at, backoff = 0.0, RETRY_FIRST_S
        last_append = time.monotonic()
        try:
            while True:
                if not self.wal.is_open and time.monotonic() >= retry_at:
                    try:
                        segment = self.wal.open_segment()
                        self._writer_q.put(("open", segment))
                        self.wal.sync()  # writes the segment's header: a probe that the disk takes data
                        self.troubles.cleared(WAL)
                    except OSError as exc:
                        if self.wal.is_open:
                            self._writer_q.put(("close", self.wal.abandon_segment()))
                        self.troubles.hit(WAL, exc)
                        retry_at, backoff = time.monotonic() + backoff, min(backoff * 2, RETRY_MAX_S)
                batch = next_batch(self._wal_q, min(cfg.idle_flush_s / 2, 0.2))
                stop = any(item is _STOP for item in batch)
                items = [item for item in batch if item is not _STOP]
                now = time.monotonic()
                if items and not self.wal.is_open:
                    self._refuse(items, f"write-ahead log unavailable: {self.troubles.now.get(WAL)}")
                elif items:
                    try:
                        self._log_batch(items)
                        last_append, backoff = now, RETRY_FIRST_S
                    except OSError as exc:
                        self.troubles.hit(WAL, exc)
                        self._refuse(items, f"write-ahead log failed: {exc!r}")
                        self._writer_q.put(("close", self.wal.abandon_segment()))
                        retry_at, backoff = now + backoff, min(backoff * 2, RETRY_MAX_S)
                has_data = self.wal.is_open and self.wal.segment_bytes > 0
                full = self.wal.segment_bytes >= cfg.wal_segment_bytes
                old = now - self.wal.segment_started >= cfg.roll_seconds
                idle = not items and now - last_append >= cfg.idle_flush_s
                if self.wal.is_open and (stop or (has_data and (full or old or idle))):
                    try:
                        self._writer_q.put(("close", self.wal.close_segment()))
                    except OSError as exc:
                        self.troubles.hit(WAL, exc)
                        self._writer_q.put(("close", self.wal.abandon_segment()))
                if stop:
                    self._refuse_queued("collector is shutting down")
                    self._writer_q.put(_STOP)
                    return
        except Exception as exc:  # a bug, not the storage: stop acknowledging anything
            self._fail(f"write-ahead log failed: {exc!r}")
            self._refuse_queued(f"write-ahead log failed: {exc!r}")
            self._writer_q.put(_STOP)

    def _log_batch(self, items: list[_Item]) -> None:
        for item in items:
            self.wal.append(item.payload, item.received_at_ns)
        self.wal.sync()
        for item in items:
            self._writer_q.put(("table", item))
            item.future.set_result(None)

    def _writer_loop(self) -> None:
        """Hand tables to the Parquet writer; write files; delete a closed segment once its spans are in
        Parquet. A storage error is retried with backoff (the WAL keeps the data meanwhile)."""
        name_os_thread()
        while True:
            message = self._writer_q.get()
            if message is _STOP:
                break
            kind, value = message
            try:
                if kind == "open":
                    self.writer.file_prefix = file_tag(self.config.instance, value)
                elif kind == "table":  # the body goes; the buffered table counts until its file is written
                    self.budget.release(value.cost - self.writer.add(value.table))
                    # a file's worth (all partitions together), or requests are refused: write now
                    due = self.writer.buffered_bytes >= self.file_bytes or self.budget.full
                    self._write_files(self.writer.flush if due else self.writer.write_due)
                elif kind == "close":
                    self._write_files(self.writer.flush)
                    self._retrying(WRITER, functools.partial(self.wal.delete, value))
            except Exception as exc:  # a bug: keep the WAL segment, the next start replays it
                self._fail(f"Parquet writer failed: {exc!r}")
                break

    def _write_files(self, step: Callable[[], list[Path]]) -> None:
        """Run a writer step (retried) and give the bytes of the rows it wrote back to the budget."""
        before = self.writer.buffered_bytes
        self.stats["files"] += len(self._retrying(WRITER, step))
        self.budget.release(before - self.writer.buffered_bytes)

    def _retrying(self, part: str, step: Callable[[], _T]) -> _T:
        return self.troubles.retrying(part, step, stopping=lambda: self._closing)

    def _fail(self, reason: str) -> None:
        log.error(reason)
        self.failure = reason

    def _refuse_queued(self, reason: str) -> None:
        """Answer the requests still waiting for the failed WAL (their clients retry elsewhere or later);
        ``submit`` refuses new ones, since ``failure`` is set."""
        queued = []
        with self._lock:  # submit() queues under it: nothing is queued after this drain
            while True:
                try:
                    queued.append(self._wal_q.get_nowait())
                except queue.Empty:
                    break
        self._refuse([item for item in queued if item is not _STOP], reason)

    def _refuse(self, items: list[_Item], reason: str) -> None:
        """Answer ``items`` with :class:`Unavailable` and take them out of the queued bytes."""
        self.budget.release(sum(item.cost for item in items))
        for item in items:
            item.future.set_exception(Unavailable(reason))
