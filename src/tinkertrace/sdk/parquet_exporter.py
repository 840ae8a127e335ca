"""The embedded sink: a ``SpanExporter`` writing the collector's Parquet files in process.

Each batch is encoded to OTLP and goes through the collector's own converter and partitioned writer,
so its files hold the same tables as the collector's and the builder reads both alike.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from tinkertrace.sdk.export import encode_batch
from tinkertrace.sdk.stats import ExportStats

log = logging.getLogger("tinkertrace")


class ParquetSpanExporter(SpanExporter):
    """Write spans to hive-partitioned Parquet under ``root`` (see ``spanstore.writer``)."""

    def __init__(self, root: str | Path, stats: ExportStats | None = None) -> None:
        from tinkertrace.spanstore.writer import PartitionedParquetWriter

        self.root = Path(root)
        self.stats = stats if stats is not None else ExportStats()
        self._writer = PartitionedParquetWriter(self.root)

    def __repr__(self) -> str:
        return f"ParquetSpanExporter({str(self.root)!r})"

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        from tinkertrace.spanstore.convert import request_to_table

        request = encode_batch(spans, self.stats)
        if request is None:
            return SpanExportResult.FAILURE
        result = request_to_table(request, time.time_ns())
        if result.fallback:
            self.stats.add("conversion_fallbacks")
            log.debug("tinkertrace: the sink's compiled decoder declined a batch (%s)", result.fallback)
        if result.rejected:
            self.stats.add("spans_rejected", result.rejected)
            log.warning(
                "tinkertrace: the sink rejected %d spans: %s", result.rejected, "; ".join(result.errors[:3])
            )
        if result.table.num_rows:
            self._writer.write(result.table)
        self.stats.add("spans_exported", result.accepted)
        return SpanExportResult.FAILURE if result.rejected else SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Close the open files, so what was written can be read."""
        self._writer.flush()
        return True

    def shutdown(self) -> None:
        self._writer.close()
