"""The reference decoder: OTLP request bytes → spans table, in Python, one span at a time.

It defines the conversion's semantics: which spans are rejected and with which message, what each
attribute and event becomes (``values``). It takes every valid encoding of an
``ExportTraceServiceRequest``; the compiled decoder (``compiled``) reproduces its output exactly for
the encodings exporters usually write and declines the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from google.protobuf.message import DecodeError

from tinkertrace.schemas import spans as spans_schema
from tinkertrace.schemas.columns import TOKEN_COLUMNS
from tinkertrace.spanstore.convert import values as v
from tinkertrace.spanstore.convert.raw_proto import RawExportTraceServiceRequest
from tinkertrace.spanstore.encoding import lists_from_packed

MAX_ERRORS = 20  # error strings kept per request; the counts stay exact
KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
STATUSES = ("UNSET", "OK", "ERROR")
MAX_TIME_NS = 2**63 - 1  # the timestamp columns are int64 nanoseconds (until the year 2262)
_ZERO_TRACE, _ZERO_SPAN = bytes(16), bytes(8)


@dataclass
class ConversionResult:
    """The converted table, how many spans were accepted/rejected and why, and which decoder made it
    (``fallback``: why the compiled decoder declined the request, when it did)."""

    table: pa.Table
    accepted: int
    rejected: int
    errors: list[str] = field(default_factory=list)
    decoder: str = "reference"
    fallback: str | None = None


# Order of the per-span row tuple built by convert (then transposed into columns).
_ROW_COLUMNS = (
    "trace_id",
    "span_id",
    "parent_span_id",
    "name",
    "kind",
    "start_time",
    "end_time",
    "status_code",
    "status_message",
    "service_name",
    "scope_name",
    "attributes",
    "resource_attributes",
    "events",
    "links",
    *(column for column, _ in v.SCALAR_LIFTS.values()),
    *(column for column, _ in v.TOKEN_LIFTS.values()),
)


def id_problem(
    trace_len: int, trace_zero: bool, span_len: int, span_zero: bool, parent_len: int
) -> str | None:
    """Why a span's ids are invalid (``None`` if they are fine)."""
    if trace_len != 16 or trace_zero:
        return f"trace_id must be 16 non-zero bytes, got {trace_len} bytes"
    if span_len != 8 or span_zero:
        return f"span_id must be 8 non-zero bytes, got {span_len} bytes"
    if parent_len not in (0, 8):
        return f"parent_span_id must be 8 bytes or empty, got {parent_len} bytes"
    return None


def time_problem(start_ns: int, end_ns: int) -> str | None:
    """Why a span's times cannot be stored (``None`` if they can)."""
    for name, value in (("start_time_unix_nano", start_ns), ("end_time_unix_nano", end_ns)):
        if value > MAX_TIME_NS:
            return f"{name} {value} is beyond the largest storable time (2^63-1 ns)"
    return None


def convert(body: bytes, received_at_ns: int) -> ConversionResult:
    """Convert every valid span of a serialized request; spans with invalid ids or times are rejected
    and counted. ``DecodeError`` if the bytes are not a request."""
    request = RawExportTraceServiceRequest.FromString(body)
    rows: list[tuple[Any, ...]] = []
    errors: list[str] = []
    rejected = 0
    n_scalar = len(v.SCALAR_SLOTS)
    n_kinds, n_status = len(KINDS), len(STATUSES)
    memo_get = v.span_memo.get
    for r_index, resource_spans in enumerate(request.resource_spans):
        service, resource_json = v.resource_columns(resource_spans.resource)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope.name or None
            for s_index, span in enumerate(scope_spans.spans):
                trace_id, span_id, parent = span.trace_id, span.span_id, span.parent_span_id
                problem = id_problem(
                    len(trace_id), trace_id == _ZERO_TRACE, len(span_id), span_id == _ZERO_SPAN, len(parent)
                )
                if problem is None:
                    problem = time_problem(span.start_time_unix_nano, span.end_time_unix_nano)
                lifted: list[Any] = [None] * n_scalar
                tokens: list[Any] = [None] * (len(v.TOKEN_SLOTS) + len(v.ALIAS_SLOTS))
                rest: dict[str, bytes] = {}
                events_json = links_json = "[]"
                if problem is None:
                    try:
                        for raw in span.attributes:
                            slot, key, value = memo_get(raw) or v.span_attribute(raw)
                            if slot >= 0:
                                lifted[slot] = value
                            elif slot == v.REST:
                                rest[key] = value
                            else:
                                tokens[v.TOKEN0 - slot] = value
                        v.resolve_aliases(tokens)
                        events = span.events
                        if events:
                            events_json = (b"[%b]" % b",".join([v.event_json(e) for e in events])).decode()
                        if span.links:
                            links_json = v.links_json(span.links)
                    except DecodeError as exc:
                        problem = f"malformed event: {exc}"
                    except (ValueError, TypeError, OverflowError, IndexError) as exc:
                        problem = str(exc)
                if problem is not None:
                    rejected += 1
                    if len(errors) < MAX_ERRORS:
                        errors.append(
                            f"resource_spans[{r_index}] span[{s_index}] name={span.name!r}: {problem}"
                        )
                    continue
                kind = span.kind
                status = span.status
                code = status.code
                rows.append(
                    (
                        trace_id.hex(),
                        span_id.hex(),
                        parent.hex() if parent else None,
                        span.name,
                        KINDS[kind] if 0 <= kind < n_kinds else "UNSPECIFIED",
                        span.start_time_unix_nano,
                        span.end_time_unix_nano,
                        STATUSES[code] if 0 <= code < n_status else "UNSET",
                        status.message or None,
                        service,
                        scope,
                        b"{%b}" % b",".join(rest.values()) if rest else "{}",
                        resource_json,
                        events_json,
                        links_json,
                        *lifted,
                        *tokens,
                    )
                )
    columns = list(zip(*rows, strict=True)) if rows else [() for _ in _ROW_COLUMNS]
    cols = dict(zip(_ROW_COLUMNS, columns, strict=True))
    return ConversionResult(
        table=_build_table(cols, len(rows), received_at_ns),
        accepted=len(rows),
        rejected=rejected,
        errors=errors,
    )


def _build_table(cols: dict[str, Any], n: int, received_at_ns: int) -> pa.Table:
    schema = spans_schema()
    arrays: list[pa.Array] = []
    for f in schema:
        if f.name == "received_at":
            arrays.append(pa.array(np.full(n, received_at_ns, dtype=np.int64)).cast(f.type))
        elif f.name in TOKEN_COLUMNS:
            arrays.append(lists_from_packed(pa.array(cols[f.name], pa.binary()), f.type))
        elif f.name in ("start_time", "end_time"):
            arrays.append(pa.array(np.asarray(cols[f.name], dtype=np.int64)).cast(f.type))
        else:
            arrays.append(pa.array(list(cols[f.name]), type=f.type))
    return pa.Table.from_arrays(arrays, schema=schema)
