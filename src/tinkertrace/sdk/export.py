"""The span pipeline behind ``init()``: a bounded in-memory queue drained by a worker thread, each
batch encoded once to OTLP protobuf and handed to every target (embedded sink, OTLP endpoint).

The agent's thread only appends to the queue; it never waits for an export. When the queue is full
the span is dropped and counted (``tinkertrace.stats()``). Work that can wait until a span has ended
(an LLM call's span: parsing the response, packing token ids, serialising messages) is queued as
a builder with :meth:`QueueExportProcessor.submit` and built on the export thread.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from tinkertrace.sdk.stats import ExportStats

log = logging.getLogger("tinkertrace")

SpanBuilder = Callable[[], ReadableSpan]
_DROP_WARNINGS = {
    "queue_full": "tinkertrace: the span queue is full, spans are being dropped "
    "(see tinkertrace.stats()['spans_dropped']); raise max_queue_spans or check the exporter",
    "after_shutdown": "tinkertrace: a span ended after tinkertrace.shutdown() and is not recorded "
    "(a rollout, agent span or LLM call still running at shutdown)",
}


class Target(Protocol):
    """Where encoded batches go."""

    def export(self, request: ExportTraceServiceRequest, n_spans: int) -> None: ...
    def flush(self, timeout_s: float) -> bool: ...
    def shutdown(self) -> None: ...


class QueueExportProcessor(SpanProcessor):
    """Queue ended spans; a daemon thread encodes and exports them in batches."""

    def __init__(
        self,
        targets: list[Target],
        stats: ExportStats,
        *,
        max_queue: int,
        batch_size: int,
        schedule_delay_s: float,
    ) -> None:
        self._targets = targets
        self._stats = stats
        self._max_queue = max_queue
        self._batch_size = batch_size
        self._delay = schedule_delay_s
        self._queue: collections.deque[ReadableSpan | SpanBuilder] = collections.deque()
        self._cond = threading.Condition()
        self._export_lock = threading.Lock()
        self._stopped = False
        self._warned: set[str] = set()  # drop reasons already warned about (once each)
        self._worker = threading.Thread(target=self._run, name="tinkertrace-export", daemon=True)
        self._worker.start()

    def submit(self, build: SpanBuilder) -> None:
        """Queue a finished span that ``build()`` makes on the export thread (whatever it reads
        must no longer change)."""
        self._enqueue(build)

    def on_end(self, span: ReadableSpan) -> None:
        self._enqueue(span)

    def _enqueue(self, item: ReadableSpan | SpanBuilder) -> None:
        with self._cond:
            stopped, full = self._stopped, len(self._queue) >= self._max_queue
            if not (stopped or full):
                self._queue.append(item)
                if len(self._queue) >= self._batch_size:
                    self._cond.notify()
        if not (stopped or full):
            self._stats.add("spans_queued")
            return
        self._stats.add("spans_dropped")
        reason = "after_shutdown" if stopped else "queue_full"
        if reason not in self._warned:
            self._warned.add(reason)
            log.warning(_DROP_WARNINGS[reason])

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._queue and not self._stopped:
                    self._cond.wait(self._delay)
                if self._stopped:
                    return
            self._export_pending()

    def _take(self) -> list[ReadableSpan | SpanBuilder]:
        with self._cond:
            n = min(len(self._queue), self._batch_size)
            return [self._queue.popleft() for _ in range(n)]

    def _export_pending(self) -> None:
        with self._export_lock:
            while batch := self._take():
                self._export(batch)

    @staticmethod
    def _built(item: ReadableSpan | SpanBuilder) -> ReadableSpan | None:
        if isinstance(item, ReadableSpan):
            return item
        try:
            return item()
        except Exception:
            log.exception("tinkertrace: building a deferred span failed; it is lost")
            return None

    def _export(self, items: list[ReadableSpan | SpanBuilder]) -> None:
        batch = [span for span in map(self._built, items) if span is not None]
        if len(batch) < len(items):
            self._stats.add("spans_rejected", len(items) - len(batch))
        try:
            request = encode_spans(batch)
        except Exception:
            log.exception("tinkertrace: could not encode %d spans; they are lost", len(batch))
            self._stats.add("spans_rejected", len(batch))
            return
        for target in self._targets:
            try:
                target.export(request, len(batch))
            except Exception:
                self._stats.add("export_errors")
                log.exception("tinkertrace: exporting %d spans to %s failed", len(batch), target)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Export everything queued now, then flush each target (files closed, spool re-sent)."""
        deadline = time.monotonic() + timeout_millis / 1000
        self._export_pending()
        ok = True
        for target in self._targets:
            ok = target.flush(max(0.0, deadline - time.monotonic())) and ok
        return ok

    def shutdown(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._worker.join(timeout=10)
        self._export_pending()
        for target in self._targets:
            try:
                target.shutdown()
            except Exception:
                log.exception("tinkertrace: shutting down %s failed", target)
