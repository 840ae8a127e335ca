"""Counters of what happened to spans, visible through ``tinkertrace.stats()``."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, fields

log = logging.getLogger("tinkertrace")


@dataclass
class ExportStats:
    """Span counts since ``init()``: every span is exported, spooled, rejected or dropped."""

    spans_queued: int = 0
    spans_exported: int = 0  # written by the embedded sink or accepted by the OTLP endpoint
    spans_dropped: int = 0  # lost: the in-memory queue was full, or the span ended after shutdown()
    spans_spooled: int = 0  # kept on disk because the OTLP endpoint could not take them
    spans_resent: int = 0  # spooled spans delivered later
    # sent to the OTLP endpoint without an answer (timeout, connection lost), so spooled and re-sent:
    # the endpoint may have stored them twice (counted again on each such send)
    spans_in_doubt: int = 0
    spans_rejected: int = 0  # refused as invalid (by the endpoint or the sink's converter)
    export_errors: int = 0  # failed export attempts (each spools its spans)
    # batches the embedded sink's compiled decoder declined, so the reference decoder converted them
    # (same rows, more CPU; the collector shows the reasons in /health)
    conversion_fallbacks: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}
