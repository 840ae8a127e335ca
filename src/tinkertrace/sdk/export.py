"""The span pipeline behind ``init()``: OpenTelemetry's ``BatchSpanProcessor``, one per exporter.

Each exporter (the embedded Parquet sink, the OTLP endpoint, any stock ``SpanExporter`` passed to
``init(exporters=[...])``) gets its own ``BatchSpanProcessor``: a bounded queue on the agent's thread,
a worker thread that hands batches to the exporter. One slow or unreachable exporter never holds up
another. The SDK's own two exporters go through :class:`TrainingDataProcessor`, which adds what
training data needs on top of the stock processor: every span accounted for in
``tinkertrace.stats()``, the newest span dropped (not the oldest) when the queue is full, one warning
per cause, and a ``force_flush`` that also flushes the exporter (sink files closed, spool re-sent)
and returns its answer.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from tinkertrace.sdk.stats import ExportStats

if TYPE_CHECKING:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

log = logging.getLogger("tinkertrace")

_DROP_WARNINGS = {
    "queue_full": "tinkertrace: the span queue is full, spans are being dropped "
    "(see tinkertrace.stats()['spans_dropped']); raise max_queue_spans or check the exporter",
    "after_shutdown": "tinkertrace: a span ended after tinkertrace.shutdown() and is not recorded "
    "(a rollout, agent span or LLM call still running at shutdown)",
}


def encode_batch(spans: Sequence[ReadableSpan], stats: ExportStats) -> ExportTraceServiceRequest | None:
    """The batch as an OTLP request, or None (logged, counted as rejected) if it cannot be encoded."""
    # imported on the export thread's first batch, not at init: the protobuf classes take ~45 ms to load
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    try:
        return encode_spans(spans)
    except Exception:
        log.exception("tinkertrace: could not encode %d spans; they are lost", len(spans))
        stats.add("spans_rejected", len(spans))
        return None


class _Handoff(SpanExporter):
    """Between the stock processor and the exporter: counts spans leaving the queue; an exporter
    that raises costs one ``export_errors``, never the worker thread."""

    def __init__(self, exporter: SpanExporter, processor: TrainingDataProcessor) -> None:
        self.exporter = exporter
        self._processor = processor

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self._processor.left_queue(len(spans))
        try:
            return self.exporter.export(spans)
        except Exception:
            self._processor.stats.add("export_errors")
            log.exception("tinkertrace: exporting %d spans to %s failed", len(spans), self.exporter)
            return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        try:
            self.exporter.shutdown()
        except Exception:
            log.exception("tinkertrace: shutting down %s failed", self.exporter)


class TrainingDataProcessor(BatchSpanProcessor):
    """``BatchSpanProcessor`` for the SDK's own exporters, with every span accounted for.

    The stock queue drops its *oldest* span when full and logs each time; here a span that finds
    ``max_queue`` spans waiting is the one dropped (what is queued stays queued), counted in
    ``spans_dropped`` and warned about once. The count of waiting spans is kept here (one lock on
    the agent's thread) so that the stock queue never reaches its own limit.
    """

    def __init__(
        self,
        exporter: SpanExporter,
        stats: ExportStats,
        *,
        max_queue: int,
        batch_size: int,
        schedule_delay_s: float,
    ) -> None:
        self.exporter = exporter
        self.stats = stats
        self._max_queue = max_queue
        self._waiting = 0
        self._lock = threading.Lock()
        self._closed = False
        self._warned: set[str] = set()  # drop causes already warned about (once each)
        if hasattr(os, "register_at_fork"):  # a forked child starts with the stock queue empty
            forget = weakref.WeakMethod(self._forget_waiting)
            os.register_at_fork(after_in_child=lambda: (method := forget()) and method())
        super().__init__(
            _Handoff(exporter, self),
            max_queue_size=max(max_queue, batch_size),  # the limit is kept above; its own is never hit
            schedule_delay_millis=schedule_delay_s * 1000,
            max_export_batch_size=batch_size,
        )

    def _forget_waiting(self) -> None:
        self._lock = threading.Lock()
        self._waiting = 0

    def left_queue(self, n: int) -> None:
        with self._lock:
            self._waiting -= n

    def on_end(self, span: ReadableSpan) -> None:
        with self._lock:
            cause = (
                "after_shutdown" if self._closed else "queue_full" if self._waiting >= self._max_queue else ""
            )
            if not cause:
                self._waiting += 1
        if not cause:
            self.stats.add("spans_queued")
            super().on_end(span)
            return
        self.stats.add("spans_dropped")
        if cause not in self._warned:
            self._warned.add(cause)
            log.warning(_DROP_WARNINGS[cause])

    def force_flush(self, timeout_millis: int | None = 30_000) -> bool:
        """Export everything queued now, then flush the exporter (files closed, spool re-sent)."""
        timeout_millis = 30_000 if timeout_millis is None else timeout_millis
        deadline = time.monotonic() + timeout_millis / 1000
        exported = super().force_flush(timeout_millis)
        left_ms = max(0, int((deadline - time.monotonic()) * 1000))
        return self.exporter.force_flush(left_ms) and exported

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
        super().shutdown()
