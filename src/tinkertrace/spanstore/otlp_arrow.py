"""OTLP ``ExportTraceServiceRequest`` → Arrow table with exactly the ``spans`` schema.

Well-known attributes (``semconv``) are lifted into typed columns; everything else becomes JSON text.
Token ids and logprobs arrive packed (``semconv.ENCODING_PACKED``: little-endian int32 / float32
bytes) or as plain OTel int/float arrays; either way each column is built with one concatenation
and one ``numpy.frombuffer``, never a Python loop over tokens for packed data.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tinkertrace import schemas, semconv
from tinkertrace.spanstore.encoding import IDS_DTYPE, LOGPROBS_DTYPE


def _dumps(obj: Any) -> str:
    """Compact JSON text (orjson: ~10x faster than json.dumps, which matters per span)."""
    return orjson.dumps(obj).decode()


MAX_ERRORS = 20  # error strings kept per request; the counts stay exact

_KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
_STATUS = ("UNSET", "OK", "ERROR")

# attribute key -> (column, kind); kind picks the coercion
_SCALAR_COLUMNS: dict[str, tuple[str, str]] = {
    semconv.SPAN_TYPE: ("span_type", "str"),
    semconv.ROLLOUT_ID: ("rollout_id", "str"),
    semconv.TASK_ID: ("task_id", "str"),
    semconv.ATTEMPT: ("attempt", "int"),
    semconv.SPLIT: ("split", "str"),
    semconv.AGENT_NAME: ("agent_name", "str"),
    semconv.GENAI_REQUEST_MODEL: ("model", "str"),
    semconv.GENAI_RESPONSE_ID: ("response_id", "str"),
    semconv.REWARD_NAME: ("reward_name", "str"),
    semconv.REWARD_VALUE: ("reward_value", "float"),
    semconv.TOKEN_SOURCE: ("token_source", "str"),
    semconv.POLICY_VERSION: ("policy_version", "int"),
}
_TOKEN_COLUMNS: dict[str, tuple[str, np.dtype]] = {
    semconv.PROMPT_TOKEN_IDS: ("prompt_token_ids", IDS_DTYPE),
    semconv.RESPONSE_TOKEN_IDS: ("response_token_ids", IDS_DTYPE),
    semconv.RESPONSE_LOGPROBS: ("response_logprobs", LOGPROBS_DTYPE),
}
_SCALAR_NAMES = [column for column, _ in _SCALAR_COLUMNS.values()]
_TOKEN_NAMES = [column for column, _ in _TOKEN_COLUMNS.values()]


@dataclass
class ConversionResult:
    """The converted table plus how many spans were accepted/rejected and why."""

    table: pa.Table
    accepted: int
    rejected: int
    errors: list[str] = field(default_factory=list)


def any_value(value: AnyValue) -> Any:
    """A JSON-friendly Python value for an OTLP ``AnyValue`` (bytes as base64 text)."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value
    if kind == "int_value":
        return value.int_value
    if kind == "double_value":
        return value.double_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    return None


def _attrs(key_values: Any) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in key_values}


def _coerce(raw: Any, kind: str) -> Any:
    """Coerce a lifted attribute to its column type; ``ValueError``/``TypeError`` if impossible."""
    if kind == "str":
        return raw if isinstance(raw, str) else _dumps(raw)
    if isinstance(raw, bool):
        raise TypeError("boolean")
    if kind == "int":
        return int(raw)
    return float(raw)


def _token_bytes(value: AnyValue, kind: str | None, dtype: np.dtype) -> bytes:
    """Packed little-endian bytes of a token attribute (bytes, int/float array, or JSON list text)."""
    if kind == "bytes_value":
        data = value.bytes_value
        if len(data) % 4:
            raise ValueError(f"packed length {len(data)} is not a multiple of 4 bytes")
        return data
    if kind == "array_value":
        items = [any_value(v) for v in value.array_value.values]
    elif kind == "string_value":
        items = json.loads(value.string_value)
        if not isinstance(items, list):
            raise ValueError("JSON text is not a list")
    else:
        raise ValueError(f"unsupported value type {kind}")
    return np.asarray(items, dtype=dtype).tobytes()


def _list_column(chunks: Any, dtype: np.dtype, value_type: pa.DataType) -> pa.Array:
    """One Arrow list column from per-row packed bytes (None = null): one join, one frombuffer."""
    lengths = np.fromiter((-1 if c is None else len(c) for c in chunks), dtype=np.int64, count=len(chunks))
    valid = lengths >= 0
    if not valid.any():
        return pa.nulls(len(chunks), type=pa.list_(value_type))
    values = np.frombuffer(b"".join(c for c in chunks if c is not None), dtype=dtype)
    offsets = np.zeros(len(chunks) + 1, dtype=np.int32)
    np.cumsum(np.where(valid, lengths, 0) // dtype.itemsize, out=offsets[1:])
    mask = None if valid.all() else pa.array(~valid)
    return pa.ListArray.from_arrays(
        pa.array(offsets), pa.array(values.astype(dtype.newbyteorder("="), copy=False)), mask=mask
    )


def empty_table() -> pa.Table:
    """A zero-row table with the spans schema."""
    return schemas.spans().empty_table()


# Order of the per-span row tuple built by request_to_table (then transposed into columns).
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
    *_SCALAR_NAMES,
    *_TOKEN_NAMES,
)
# attribute key -> (slot in the lifted list, coercion kind); token key -> (slot, dtype)
_SCALAR_SLOTS = {key: (i, kind) for i, (key, (_, kind)) in enumerate(_SCALAR_COLUMNS.items())}
_TOKEN_SLOTS = {key: (i, dtype) for i, (key, (_, dtype)) in enumerate(_TOKEN_COLUMNS.items())}


def request_to_table(request: ExportTraceServiceRequest, received_at_ns: int) -> ConversionResult:
    """Convert every valid span of ``request``; spans with missing/invalid ids are rejected and counted."""
    rows: list[tuple[Any, ...]] = []
    errors: list[str] = []
    rejected = 0
    scalar_slots, token_slots, n_scalar = _SCALAR_SLOTS, _TOKEN_SLOTS, len(_SCALAR_SLOTS)
    n_kinds, n_status = len(_KINDS), len(_STATUS)
    for r_index, resource_spans in enumerate(request.resource_spans):
        resource_attrs = _attrs(resource_spans.resource.attributes)
        resource_json = _dumps(resource_attrs)
        service = resource_attrs.get("service.name")
        service = service if isinstance(service, str) else None
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope.name or None
            for s_index, span in enumerate(scope_spans.spans):
                trace_id, span_id, parent = span.trace_id, span.span_id, span.parent_span_id
                problem = None
                if len(trace_id) != 16 or not any(trace_id):
                    problem = f"trace_id must be 16 non-zero bytes, got {len(trace_id)} bytes"
                elif len(span_id) != 8 or not any(span_id):
                    problem = f"span_id must be 8 non-zero bytes, got {len(span_id)} bytes"
                elif parent and len(parent) != 8:
                    problem = f"parent_span_id must be 8 bytes or empty, got {len(parent)} bytes"
                lifted: list[Any] = [None] * n_scalar
                tokens: list[bytes | None] = [None, None, None]
                rest: dict[str, Any] = {}
                if problem is None:
                    for kv in span.attributes:
                        key = kv.key
                        value = kv.value
                        which = value.WhichOneof("value")
                        token_slot = token_slots.get(key)
                        if token_slot is not None:
                            try:
                                tokens[token_slot[0]] = _token_bytes(value, which, token_slot[1])
                            except (ValueError, TypeError, OverflowError) as exc:
                                problem = f"attribute {key!r}: {exc}"
                                break
                            continue
                        if which == "string_value":
                            raw: Any = value.string_value
                        elif which == "int_value":
                            raw = value.int_value
                        elif which == "double_value":
                            raw = value.double_value
                        elif which == "bool_value":
                            raw = value.bool_value
                        else:
                            raw = any_value(value)
                        slot = scalar_slots.get(key)
                        if slot is not None and raw is not None:
                            if slot[1] == "str" and which == "string_value":
                                lifted[slot[0]] = raw
                                continue
                            try:
                                lifted[slot[0]] = _coerce(raw, slot[1])
                                continue
                            except (ValueError, TypeError, OverflowError):
                                pass  # keep the odd value in the JSON attributes instead
                        rest[key] = raw
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
                events = span.events
                links = span.links
                rows.append(
                    (
                        trace_id.hex(),
                        span_id.hex(),
                        parent.hex() if parent else None,
                        span.name,
                        _KINDS[kind] if 0 <= kind < n_kinds else "UNSPECIFIED",
                        span.start_time_unix_nano,
                        span.end_time_unix_nano,
                        _STATUS[code] if 0 <= code < n_status else "UNSET",
                        status.message or None,
                        service,
                        scope,
                        _dumps(rest) if rest else "{}",
                        resource_json,
                        _events_json(events) if events else "[]",
                        _links_json(links) if links else "[]",
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


def _events_json(events: Any) -> str:
    if not events:
        return "[]"
    return _dumps(
        [
            {"name": e.name, "time_unix_nano": e.time_unix_nano, "attributes": _attrs(e.attributes)}
            for e in events
        ],
    )


def _links_json(links: Any) -> str:
    if not links:
        return "[]"
    return _dumps(
        [
            {"trace_id": lk.trace_id.hex(), "span_id": lk.span_id.hex(), "attributes": _attrs(lk.attributes)}
            for lk in links
        ],
    )


def _build_table(cols: dict[str, Any], n: int, received_at_ns: int) -> pa.Table:
    schema = schemas.spans()
    arrays: list[pa.Array] = []
    for f in schema:
        if f.name == "received_at":
            arrays.append(pa.array(np.full(n, received_at_ns, dtype=np.int64)).cast(f.type))
        elif f.name in _TOKEN_COLUMNS_BY_NAME:
            arrays.append(_list_column(cols[f.name], _TOKEN_COLUMNS_BY_NAME[f.name], f.type.value_type))
        elif f.name in ("start_time", "end_time"):
            arrays.append(pa.array(np.asarray(cols[f.name], dtype=np.int64)).cast(f.type))
        else:
            arrays.append(pa.array(list(cols[f.name]), type=f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


_TOKEN_COLUMNS_BY_NAME = {column: dtype for column, dtype in _TOKEN_COLUMNS.values()}
