"""The embedded sink: OTLP batches → the collector's converter and Parquet writer, in process.

Files are exactly the collector's (same converter, same partitioned writer), so the builder reads
both alike.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tinkertrace.sdk.stats import ExportStats

log = logging.getLogger("tinkertrace")


class ParquetSink:
    """Write spans to hive-partitioned Parquet under ``root`` (see ``spanstore.writer``)."""

    def __init__(self, root: Path, stats: ExportStats) -> None:
        from tinkertrace.spanstore.writer import PartitionedParquetWriter

        self.root = Path(root)
        self._stats = stats
        self._writer = PartitionedParquetWriter(self.root)

    def __repr__(self) -> str:
        return f"ParquetSink({str(self.root)!r})"

    def export(self, request: ExportTraceServiceRequest, n_spans: int) -> None:
        from tinkertrace.spanstore.convert import request_to_table

        result = request_to_table(request, time.time_ns())
        if result.rejected:
            self._stats.add("spans_rejected", result.rejected)
            log.warning(
                "tinkertrace: the sink rejected %d spans: %s", result.rejected, "; ".join(result.errors[:3])
            )
        if result.table.num_rows:
            self._writer.write(result.table)
        self._stats.add("spans_exported", result.accepted)

    def flush(self, timeout_s: float) -> bool:
        self._writer.flush()
        return True

    def shutdown(self) -> None:
        self._writer.close()
