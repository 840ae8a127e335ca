"""Where the endpoint's journal delivers the spans it made durable: a spans folder or a collector.

Each target takes the journal's span records (OTLP ``ExportTraceServiceRequest`` bytes) segment by
segment: :meth:`Target.begin` a segment, :meth:`Target.deliver` its records, :meth:`Target.end` it (after
which the journal deletes the segment), and :meth:`Target.replay` a whole segment left by an earlier run.

- :class:`ParquetTarget` writes the collector's Parquet files, named by the segment
  (:func:`~tinkertrace.collector.ingest.file_tag`); a replay first deletes the files named by its segment
  (:func:`~tinkertrace.collector.ingest.remove_segment_files`), so each span is stored exactly once,
  however the previous run ended.
- :class:`CollectorTarget` sends each record with the SDK's OTLP exporter
  (:meth:`~tinkertrace.sdk.otlp.OtlpSpoolingExporter.export_payload`): what the collector does not take
  now waits in the exporter's spool (fsynced) and is re-sent. Delivery to a collector is at least once: a
  run killed after the collector took a record and before the segment was deleted sends it again on
  replay, with the same span ids, and readers count a span stored twice once (the builder keeps one row
  per trace and span id).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

from tinkertrace.collector.ingest import file_tag, remove_segment_files
from tinkertrace.sdk.config import TraceSettings
from tinkertrace.sdk.otlp import OtlpSpoolingExporter
from tinkertrace.sdk.stats import ExportStats
from tinkertrace.spanstore.convert import body_to_table
from tinkertrace.spanstore.writer import PartitionedParquetWriter

log = logging.getLogger("tinkertrace.serving")

SpanRecord = tuple[bytes, int]  # (OTLP request bytes, when the journal logged it, ns)


class Target(Protocol):
    """Takes the journal's span records, segment by segment (see the module docstring)."""

    def begin(self, segment: int) -> None: ...
    def deliver(self, payload: bytes, logged_at_ns: int) -> None: ...
    def end(self, segment: int) -> None: ...
    def replay(self, segment: int, records: list[SpanRecord]) -> None: ...
    def flush(self, timeout_s: float) -> bool: ...
    def close(self) -> None: ...


class ParquetTarget:
    """Span records into Parquet under ``root``, each file named by its journal segment."""

    def __init__(self, root: Path, instance: str, stats: ExportStats) -> None:
        self.root, self.instance, self.stats = Path(root), instance, stats
        self.writer = PartitionedParquetWriter(self.root, max_file_age_s=3600.0)  # written at a segment's end

    def __repr__(self) -> str:
        return f"ParquetTarget({str(self.root)!r})"

    def begin(self, segment: int) -> None:
        self.writer.file_prefix = file_tag(self.instance, segment)

    def deliver(self, payload: bytes, logged_at_ns: int) -> None:
        result = body_to_table(payload, logged_at_ns)
        if result.rejected:  # the endpoint's own spans: a bug if it ever happens
            self.stats.add("spans_rejected", result.rejected)
            log.warning("tinkertrace: %d spans were not stored: %s", result.rejected, result.errors[:3])
        self.writer.write(result.table)
        self.stats.add("spans_exported", result.accepted)

    def end(self, segment: int) -> None:
        self.writer.flush()

    def replay(self, segment: int, records: list[SpanRecord]) -> None:
        remove_segment_files(self.root, file_tag(self.instance, segment))
        self.begin(segment)
        for payload, logged_at_ns in records:
            self.deliver(payload, logged_at_ns)
        self.end(segment)

    def flush(self, timeout_s: float) -> bool:
        return True  # a segment's files are written when it ends (Journal.flush ends it)

    def close(self) -> None:
        self.writer.close()


class CollectorTarget:
    """Span records sent to an OTLP endpoint; what it cannot take now waits in the spool."""

    def __init__(self, config: TraceSettings, stats: ExportStats) -> None:
        self.exporter = OtlpSpoolingExporter.from_config(config, stats)

    def __repr__(self) -> str:
        return repr(self.exporter)

    def begin(self, segment: int) -> None:
        pass

    def deliver(self, payload: bytes, logged_at_ns: int) -> None:
        self.exporter.export_payload(payload, span_count(payload))

    def end(self, segment: int) -> None:
        pass  # every record was sent or spooled (fsynced) when delivered

    def replay(self, segment: int, records: list[SpanRecord]) -> None:
        for payload, logged_at_ns in records:
            self.deliver(payload, logged_at_ns)

    def flush(self, timeout_s: float) -> bool:
        return self.exporter.force_flush(int(timeout_s * 1000))

    def close(self) -> None:
        self.exporter.shutdown()


def span_count(payload: bytes) -> int:
    """How many spans an OTLP request holds."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest.FromString(payload)
    return sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)


def targets_for(config: TraceSettings, stats: ExportStats, instance: str) -> list[Target]:
    """The targets of an endpoint recording with ``config``: its spans folder, its collector, or both."""
    targets: list[Target] = []
    if config.spans_dir is not None:
        targets.append(ParquetTarget(config.spans_dir, instance, stats))
    if config.otlp_url is not None:
        targets.append(CollectorTarget(config, stats))
    return targets


def default_journal_dir(config: TraceSettings, instance: str) -> Path:
    """``<spans folder>/_journal/<instance>`` (readers skip folders named ``_*``), or, recording to a
    collector only, ``<spool folder>/journal/<instance>`` (the spool's default is per collector URL)."""
    if config.spans_dir is not None:
        return Path(config.spans_dir) / "_journal" / instance
    assert config.spool_dir is not None
    return Path(config.spool_dir) / "journal" / instance
