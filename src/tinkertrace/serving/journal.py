"""The endpoint's journal: an answered call is a stored call, and an open rollout outlives a restart.

Every span the endpoint records (LLM calls, rewards, rollout ends) and every change to the state of a
rollout (opened, finished, forgotten) is appended to a write-ahead log (the collector's
:class:`~tinkertrace.collector.wal.WriteAheadLog`) and fsynced, all that is queued at once in one sync
(group commit), before the answer leaves: a handler ends its spans inside :meth:`Journal.capture` and
awaits :meth:`Durable.wait`. A log record is ``C`` + one LLM call's own bytes
(:mod:`.call_records`: its span is built after the answer, on the delivery thread), ``S`` + the other
spans of one commit (rollouts, rewards) as an OTLP ``ExportTraceServiceRequest``, or ``R`` + a JSON
list of rollout states. The counts a rollout's root
span reports (LLM calls, rewards) are counted here from the spans committed, so after a crash they
match what was stored.

A delivery thread then hands the span records to the targets (:mod:`.journal_targets`: Parquet files
named by their segment, or the OTLP exporter and its spool). Segments roll every ``roll_s`` seconds;
the new segment starts with a snapshot of every rollout's state, and the old one is deleted once its
spans are delivered. At start, :meth:`Journal.recover` reads the segments left by the previous run:
rollout states (last one wins) and span records, which go to the targets again
(:meth:`~.journal_targets.Target.replay`: exactly once into Parquet, at least once to a collector).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import orjson
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from tinkertrace import semconv
from tinkertrace.collector.ingest import name_os_thread, next_batch
from tinkertrace.collector.wal import WriteAheadLog, iter_records
from tinkertrace.sdk.export import encode_batch
from tinkertrace.sdk.runtime import Runtime
from tinkertrace.sdk.spans import COUNTED
from tinkertrace.serving.call_records import call_record, restored_span
from tinkertrace.serving.journal_delivery import (
    STOP,
    Delivery,
    Durable,
    Item,
    JournalStats,
    JournalUnavailable,
    lock_folder,
    settle,
)
from tinkertrace.serving.journal_targets import SpanRecord, Target, span_count

log = logging.getLogger("tinkertrace.serving")

SPANS, CALL, ROLLOUTS = b"S", b"C", b"R"  # the first byte of a log record
RolloutRecord = dict[str, Any]  # an open rollout's state, or {"id", "status"} once finished
_CAPTURE: contextvars.ContextVar[list[Future[None]] | None] = contextvars.ContextVar(
    "tinkertrace_journal_capture", default=None
)


class Journal(SpanProcessor):
    """The write-ahead journal of one endpoint (see the module docstring); a span processor."""

    def __init__(
        self,
        folder: Path,
        targets: Sequence[Target],
        stats: JournalStats,
        *,
        roll_s: float = 5.0,
        keep_finished: int = 100_000,
    ) -> None:
        self.folder = Path(folder)
        self._lock_fd = lock_folder(self.folder)
        self.targets = list(targets)
        self.roll_s = roll_s
        self.keep_finished = keep_finished
        self.wal = WriteAheadLog(self.folder)
        self.rollouts: dict[str, RolloutRecord] = {}  # owned by the journal thread once started
        self.stats = stats
        self._queue: queue.Queue[Any] = queue.Queue()
        self._deliveries = Delivery(self.targets, self.wal, stats)
        self._closed = False
        self._put_lock = threading.Lock()
        self._segment_has_data = False
        self._waits: deque[float] = deque(maxlen=10_000)  # seconds from queued to durable, newest last
        self._threads = [
            threading.Thread(target=self._log_loop, name="tt-journal", daemon=True),
            threading.Thread(target=self._deliveries.run, name="tt-deliver", daemon=True),
        ]

    # --- start ---------------------------------------------------------------------------------------
    def recover(self, rt: Runtime) -> dict[str, RolloutRecord]:
        """Replay what an earlier run left: its spans (calls' built with ``rt``) to the targets, its
        rollout states returned (and kept); then a new segment holds their snapshot and the old
        segments are deleted."""
        replayed = []
        for segment, records, note in iter_records(self.folder):
            if note:
                log.warning("tinkertrace journal: %s", note)
            if records is None:
                continue
            spans: list[SpanRecord] = []
            for record in records:
                kind, body = record.payload[:1], record.payload[1:]
                if kind == ROLLOUTS:
                    self._apply(orjson.loads(body))
                elif kind == SPANS:
                    spans.append((body, record.received_at_ns))
                elif kind == CALL:
                    request = encode_batch([restored_span(rt, body)], self.stats)
                    if request is not None:
                        spans.append((request.SerializeToString(), record.received_at_ns))
            for target in self.targets:
                target.replay(segment, spans)
            self.stats.add("spans_replayed", sum(span_count(payload) for payload, _ in spans))
            replayed.append(segment)
        self._open_segment()
        for segment in replayed:
            self.wal.delete(segment)
        return dict(self.rollouts)

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    # --- what handlers call --------------------------------------------------------------------------
    @contextlib.contextmanager
    def capture(self) -> Iterator[Durable]:
        """Collect the records made inside (spans ended, rollout changes) for :meth:`Durable.wait`."""
        durable = Durable()
        token = _CAPTURE.set(durable.futures)
        try:
            yield durable
        finally:
            _CAPTURE.reset(token)

    def rollout_opened(self, record: RolloutRecord) -> None:
        """Log a rollout's open state (``id`` and what it needs to be ended after a restart)."""
        self._put(Item("rollout", {**record, "llm_calls": 0, "rewards": 0, "agent_spans": 0}))

    def rollout_closed(self, record: RolloutRecord) -> None:
        """Log a rollout's end (``id``, ``status``, anything else its reader needs): finished with
        ``status``, or forgotten (``None``: its spans are its caller's, as with a rollout driven by the
        SDK)."""
        self._put(Item("rollout", record))

    def flush(self, timeout_s: float = 30.0) -> bool:
        """End the current segment now and wait until its spans reached every target (Parquet files
        written; records sent to the collector or spooled). True when all arrived."""
        item = Item("flush", None)
        self._put(item)
        try:
            item.future.result(timeout_s)
        except Exception:
            return False
        return all(target.flush(timeout_s) for target in self.targets)

    def health(self) -> dict[str, Any]:
        """Counts, and how long the last (up to 10,000) records waited to be durable (ms)."""
        waits = sorted(self._waits)
        at = {q: waits[len(waits) * q // 100] for q in (50, 99)} if waits else {}
        percentiles = {f"durable_wait_ms_p{q}": round(wait * 1000, 2) for q, wait in at.items()}
        return {"journal": str(self.folder), **self.stats.snapshot(), **percentiles}

    # --- SpanProcessor -------------------------------------------------------------------------------
    def on_end(self, span: ReadableSpan) -> None:
        self._put(Item("span", span))

    def shutdown(self) -> None:
        """Log and deliver what is queued, keep the rollout states, stop the threads; once."""
        with self._put_lock:  # nothing is queued after the stop
            if self._closed:
                return
            self._queue.put(STOP)
            self._closed = True
        for thread in self._threads:
            thread.join(60)
        for target in self.targets:
            target.close()
        os.close(self._lock_fd)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.flush(timeout_millis / 1000)

    def _put(self, item: Item) -> None:
        if (captured := _CAPTURE.get()) is not None:
            captured.append(item.future)
        with self._put_lock:
            if not self._closed:
                self._queue.put(item)
                return
        settle(item.future, JournalUnavailable("the endpoint's journal is closed"))

    # --- the journal thread --------------------------------------------------------------------------
    def _log_loop(self) -> None:
        """Commit what is queued (group commit), roll the segment every ``roll_s``, stop on ``STOP``."""
        name_os_thread()
        retry_at = 0.0
        while True:
            batch = next_batch(self._queue, 0.1)
            stop = STOP in batch
            items = [item for item in batch if item is not STOP]
            try:
                if not self.wal.is_open and time.monotonic() >= retry_at:
                    self._open_segment()
                if items and not self.wal.is_open:
                    raise OSError("the journal has no open segment (the last attempt to open one failed)")
                if items:
                    self._commit(items)
                flushing = any(item.kind == "flush" for item in items)
                aged = time.monotonic() - self.wal.segment_started >= self.roll_s
                if self._segment_has_data and (aged or flushing or stop):
                    self._roll()
                for item in items:
                    if item.kind == "flush":
                        self._deliveries.put(item)  # done once delivery reaches it
            except Exception as exc:  # the disk (OSError), or a bug: those calls are not answered 200
                log.error("tinkertrace journal: %r", exc, exc_info=not isinstance(exc, OSError))
                self.stats.add("journal_errors")
                for item in items:
                    settle(item.future, JournalUnavailable(f"the journal could not log it: {exc}"))
                if self.wal.is_open:  # kept: it holds the rollout snapshot; the next start replays it
                    self._deliveries.put(("end_keep", self.wal.abandon_segment()))
                retry_at = time.monotonic() + 1.0
            if stop:
                if self.wal.is_open:
                    self.wal.close_segment()  # it holds the rollout snapshot: kept for the next start
                self._deliveries.put(STOP)
                return

    def _commit(self, items: list[Item]) -> None:
        spans = [item.value for item in items if item.kind == "span"]
        calls = [span for span in spans if getattr(span, "source", None) is not None]
        plain = [span for span in spans if getattr(span, "source", None) is None]
        payload = b""
        if plain:  # rollout and reward spans: a few attributes each
            request = encode_batch(plain, self.stats)
            payload = request.SerializeToString() if request is not None else b""
        changed: dict[str, RolloutRecord] = {}
        for item in items:  # in queue order: a rollout's opening before its calls' spans
            if item.kind == "rollout":
                changed[item.value["id"]] = self._apply([item.value])[0]
            elif item.kind == "span":
                rollout_id = self._count(item.value)
                if rollout_id is not None:
                    changed[rollout_id] = self.rollouts[rollout_id]
                    answered = _answer_id(item.value)
                    if answered is not None:  # a reward may name it, after a restart too
                        changed[rollout_id].setdefault("answers", []).append(answered)
        now = time.time_ns()
        if payload:
            self.wal.append(SPANS + payload, now)
        for call in calls:  # the calls' own bytes: their spans are built after the answer (call_records)
            self.wal.append(CALL + call_record(call), now)
        if changed:
            self.wal.append(ROLLOUTS + orjson.dumps(list(changed.values())), now)
        self.wal.sync()
        self._segment_has_data = True
        self.stats.add("journal_commits")
        self.stats.add("spans_logged", len(spans))
        if payload:
            self._deliveries.put(("spans", payload, now, len(plain)))
        if calls:
            self._deliveries.put(("calls", calls, now))
        synced = time.perf_counter()
        for item in items:
            if item.kind == "span" and plain and not payload and item.value in plain:
                settle(item.future, JournalUnavailable("the span could not be encoded (see the log)"))
            elif item.kind != "flush":
                settle(item.future)
                self._waits.append(synced - item.queued)

    def _count(self, span: ReadableSpan) -> str | None:
        """Count ``span`` for its open rollout's root span; the rollout id, if it counted."""
        source = getattr(span, "source", None)  # an LLM call: its start attributes (nothing built)
        attributes = source.span.context_attributes if source is not None else (span.attributes or {})
        rollout_id = attributes.get(semconv.ROLLOUT_ID)
        counted = COUNTED.get(str(attributes.get(semconv.SPAN_TYPE)))
        rollout = self.rollouts.get(rollout_id) if isinstance(rollout_id, str) else None
        if counted is None or rollout is None or "status" in rollout:
            return None
        rollout[counted] = rollout.get(counted, 0) + 1
        return str(rollout_id)

    def _apply(self, records: list[RolloutRecord]) -> list[RolloutRecord]:
        """Apply rollout states in order (finished: ``status`` set; forgotten: ``status`` None)."""
        for record in records:
            rollout_id = record["id"]
            self.rollouts.pop(rollout_id, None)  # re-inserted last: the oldest finished go first
            if "status" not in record or record["status"] is not None:
                self.rollouts[rollout_id] = record
        finished = [rid for rid, r in self.rollouts.items() if "status" in r]
        for rollout_id in finished[: max(0, len(finished) - self.keep_finished)]:
            del self.rollouts[rollout_id]
        return records

    def _open_segment(self) -> None:
        """A new segment starting with the snapshot of every rollout's state, synced."""
        segment = self.wal.open_segment()
        if self.rollouts:
            self.wal.append(ROLLOUTS + orjson.dumps(list(self.rollouts.values())), time.time_ns())
        self.wal.sync()
        self._segment_has_data = False
        self._deliveries.put(("begin", segment))

    def _roll(self) -> None:
        """End the current segment; it is deleted once delivered (after the next one's snapshot is synced)."""
        ended = self.wal.close_segment()
        self._deliveries.put(("end", ended))
        self._open_segment()


def _answer_id(span: ReadableSpan) -> str | None:
    """The response id an LLM call's answer carried (its call parses the answer once, and its span is
    later built from that parse), or None for other spans."""
    response_id = getattr(getattr(span, "source", None), "response_id", None)
    return response_id() if callable(response_id) else None
