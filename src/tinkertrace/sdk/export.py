"""The span pipeline behind ``init()``: a bounded in-memory queue drained by a worker thread, each
batch encoded once to OTLP protobuf and handed to every target (embedded sink, OTLP endpoint).

The agent's thread only appends to the queue; it never waits for an export. When the queue is full
the span is dropped and counted (``tinkertrace.stats()``). Work that can wait until a span has ended
(parsing an LLM response, packing token ids, serialising messages) is handed over with
:meth:`QueueExportProcessor.defer` and done on the export thread, off the agent's path.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.trace import Span

from tinkertrace.sdk.stats import ExportStats

log = logging.getLogger("tinkertrace")

DeferredAttributes = Callable[[], Mapping[str, Any]]


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
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._deferred: dict[int, DeferredAttributes] = {}
        self._cond = threading.Condition()
        self._export_lock = threading.Lock()
        self._stopped = False
        self._worker = threading.Thread(target=self._run, name="tinkertrace-export", daemon=True)
        self._worker.start()

    def defer(self, span: Span, attributes: DeferredAttributes) -> None:
        """Add ``attributes()`` to ``span`` on the export thread, after it has ended (call before
        ``span.end()``; whatever ``attributes`` reads must no longer change)."""
        self._deferred[span.get_span_context().span_id] = attributes

    def on_end(self, span: ReadableSpan) -> None:
        with self._cond:
            if self._stopped or len(self._queue) >= self._max_queue:
                dropped = True
                if span.context is not None:
                    self._deferred.pop(span.context.span_id, None)
            else:
                dropped = False
                self._queue.append(span)
                if len(self._queue) >= self._batch_size:
                    self._cond.notify()
        self._stats.add("spans_dropped" if dropped else "spans_queued")

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._queue and not self._stopped:
                    self._cond.wait(self._delay)
                if self._stopped:
                    return
            self._export_pending()

    def _take(self) -> list[ReadableSpan]:
        with self._cond:
            n = min(len(self._queue), self._batch_size)
            return [self._queue.popleft() for _ in range(n)]

    def _export_pending(self) -> None:
        with self._export_lock:
            while batch := self._take():
                self._export(batch)

    def _complete(self, span: ReadableSpan) -> ReadableSpan:
        """``span`` with its deferred attributes added (a new immutable span), or as it is."""
        work = self._deferred.pop(span.context.span_id, None) if span.context is not None else None
        if work is None:
            return span
        try:
            extra = work()
        except Exception:
            log.exception("tinkertrace: deferred attributes of span %r failed", span.name)
            return span
        return ReadableSpan(
            name=span.name,
            context=span.context,
            parent=span.parent,
            resource=span.resource,
            attributes={**(span.attributes or {}), **extra},
            events=span.events,
            links=span.links,
            kind=span.kind,
            status=span.status,
            start_time=span.start_time,
            end_time=span.end_time,
            instrumentation_scope=span.instrumentation_scope,
        )

    def _export(self, batch: list[ReadableSpan]) -> None:
        try:
            request = encode_spans([self._complete(span) for span in batch])
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
