"""OTLP log records → the ``logs`` table (``schemas/logs.v1.json``), for the collector's ``/v1/logs``.

GenAI instrumentations send message content and evaluation results as *event* log records (e.g.
``opentelemetry-instrumentation-openai-v2`` with ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=
event_only``), carrying the trace and span id of the call they belong to; the builder joins them to
their spans. Log volume is small next to spans, so this is the plain Python path (one record at a
time, the same value conversion as spans'); records with malformed ids are rejected and counted.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
)

from tinkertrace.schemas import logs as logs_schema
from tinkertrace.spanstore.convert import ConversionResult
from tinkertrace.spanstore.convert import values as v

LOGS_FOLDER = "_logs"  # the collector writes log records under <spans folder>/_logs/ (span readers skip it)
EVENT_NAME_ATTRIBUTE = "event.name"  # where SDKs before the event_name field put it
MAX_ERRORS = 20


def _hex_id(raw: bytes, size: int) -> str | None:
    """The id as lowercase hex; None when absent (empty or all zero); ValueError when malformed."""
    if not raw or raw == bytes(size):
        return None
    if len(raw) != size:
        raise ValueError(f"{'trace' if size == 16 else 'span'} id of {len(raw)} bytes (want {size})")
    return raw.hex()


def convert_logs(body: bytes, received_at_ns: int) -> ConversionResult:
    """Convert a serialized ``ExportLogsServiceRequest`` (``DecodeError`` if it is not one)."""
    request = ExportLogsServiceRequest.FromString(body)
    rows: dict[str, list[Any]] = {name: [] for name in logs_schema().names}
    errors: list[str] = []
    rejected = 0
    for resource_logs in request.resource_logs:
        service, resource_json = v.resource_columns(resource_logs.resource)
        for scope_logs in resource_logs.scope_logs:
            scope = scope_logs.scope.name or None
            for record in scope_logs.log_records:
                try:
                    trace_id, span_id = _hex_id(record.trace_id, 16), _hex_id(record.span_id, 8)
                except ValueError as exc:
                    rejected += 1
                    if len(errors) < MAX_ERRORS:
                        errors.append(f"log record rejected: {exc}")
                    continue
                attributes = v.attributes_dict(record.attributes)
                event_name = getattr(record, "event_name", "") or attributes.get(EVENT_NAME_ATTRIBUTE)
                body_value = v.any_value(record.body) if record.HasField("body") else None
                for name, value in (
                    ("trace_id", trace_id), ("span_id", span_id),
                    ("time", record.time_unix_nano or None),
                    ("observed_time", record.observed_time_unix_nano or None),
                    ("severity_number", int(record.severity_number)),
                    ("severity_text", record.severity_text or None),
                    ("event_name", event_name if isinstance(event_name, str) else None),
                    ("body", None if body_value is None else v.dumps(body_value)),
                    ("attributes", v.dumps(attributes)), ("resource_attributes", resource_json),
                    ("service_name", service), ("scope_name", scope), ("received_at", received_at_ns),
                ):  # fmt: skip
                    rows[name].append(value)
    table = pa.table(rows, schema=logs_schema())
    return ConversionResult(table, accepted=table.num_rows, rejected=rejected, errors=errors)
