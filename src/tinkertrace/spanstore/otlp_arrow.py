"""OTLP ``ExportTraceServiceRequest`` → Arrow table with exactly the ``spans`` schema.

Well-known attributes (``semconv``) are lifted into typed columns; everything else becomes JSON text.
Token ids and logprobs arrive packed (``semconv.ENCODING_PACKED``: little-endian int32 / float32
bytes) or as plain OTel int/float arrays; either way each column is built with one concatenation
and one ``numpy.frombuffer``, never a Python loop over tokens for packed data.

:func:`body_to_table` is the entry point: it tries the compiled converter (``otlp_fast``) and falls
back to :func:`reference_body_to_table`, the Python decoder in this module, which defines the semantics.
"""

from __future__ import annotations

import base64
import functools
import json
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from tinkertrace import schemas, semconv
from tinkertrace.spanstore.encoding import IDS_DTYPE, LOGPROBS_DTYPE, lists_from_packed
from tinkertrace.spanstore.otlp_raw import RawEvent, RawExportTraceServiceRequest


def _dumps(obj: Any) -> str:
    """Compact JSON text (orjson: ~10x faster than json.dumps, which matters per span)."""
    return orjson.dumps(obj).decode()


MAX_ERRORS = 20  # error strings kept per request; the counts stay exact

KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
STATUSES = ("UNSET", "OK", "ERROR")

# attribute key -> (column, kind); kind picks the coercion
SCALAR_COLUMNS: dict[str, tuple[str, str]] = {
    semconv.SPAN_TYPE: ("span_type", "str"),
    semconv.ROLLOUT_ID: ("rollout_id", "str"),
    semconv.TASK_ID: ("task_id", "str"),
    semconv.ATTEMPT: ("attempt", "int32"),
    semconv.SPLIT: ("split", "str"),
    semconv.AGENT_NAME: ("agent_name", "str"),
    semconv.GENAI_REQUEST_MODEL: ("model", "str"),
    semconv.GENAI_RESPONSE_ID: ("response_id", "str"),
    semconv.REWARD_NAME: ("reward_name", "str"),
    semconv.REWARD_VALUE: ("reward_value", "float"),
    semconv.TOKEN_SOURCE: ("token_source", "str"),
    semconv.POLICY_VERSION: ("policy_version", "int"),
}
TOKEN_COLUMNS: dict[str, tuple[str, np.dtype]] = {
    semconv.PROMPT_TOKEN_IDS: ("prompt_token_ids", IDS_DTYPE),
    semconv.RESPONSE_TOKEN_IDS: ("response_token_ids", IDS_DTYPE),
    semconv.RESPONSE_LOGPROBS: ("response_logprobs", LOGPROBS_DTYPE),
}
# Other producers' keys for the same token columns (Agent-lightning's int lists): lifted the same way
# when a span lacks ours (ours win), kept in the JSON attributes when they are not token arrays.
TOKEN_ALIASES: dict[str, str] = {
    semconv.AGL_PROMPT_TOKEN_IDS: semconv.PROMPT_TOKEN_IDS,
    semconv.AGL_RESPONSE_TOKEN_IDS: semconv.RESPONSE_TOKEN_IDS,
}
_SCALAR_NAMES = [column for column, _ in SCALAR_COLUMNS.values()]
_TOKEN_NAMES = [column for column, _ in TOKEN_COLUMNS.values()]


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
    if kind == "float":
        return float(raw)
    value = int(raw)
    bits = 32 if kind == "int32" else 64
    if not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
        raise OverflowError(f"{value} does not fit int{bits}")
    return value


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


def _list_column(chunks: Any, value_type: pa.DataType) -> pa.Array:
    """One Arrow list column from per-row packed bytes (None = null)."""
    return lists_from_packed(pa.array(chunks, pa.binary()), pa.list_(value_type))


def empty_table() -> pa.Table:
    """A zero-row table with the spans schema."""
    return schemas.spans().empty_table()


# Order of the per-span row tuple built by body_to_table (then transposed into columns).
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
_SCALAR_SLOTS = {key: (i, kind) for i, (key, (_, kind)) in enumerate(SCALAR_COLUMNS.items())}
_TOKEN_SLOTS = {key: (i, dtype) for i, (key, (_, dtype)) in enumerate(TOKEN_COLUMNS.items())}
# an alias decodes into token slot len(TOKEN_COLUMNS) + its index; resolved per span by _resolve_aliases
_ALIAS_SLOTS = {
    alias: (len(TOKEN_COLUMNS) + i, _TOKEN_SLOTS[key][1])
    for i, (alias, key) in enumerate(TOKEN_ALIASES.items())
}
_ALIAS_TARGETS = [_TOKEN_SLOTS[key][0] for key in TOKEN_ALIASES.values()]
_TOKEN_KEYS_UTF8 = {key.encode(): (i, dtype) for key, (i, dtype) in _TOKEN_SLOTS.items()}

# A decoded attribute: (slot, key, value). slot >= 0: lifted scalar column, value its typed value;
# slot == REST: value is the ``"key":value`` JSON fragment; slot <= TOKEN0: token column TOKEN0 - slot,
# value its packed bytes.
REST, TOKEN0 = -1, -2
Decoded = tuple[int, str, Any]
_MEMO_MAX_BYTES = 160  # attributes this short are cached by their raw bytes (they mostly repeat)
_MEMO_MAX_ENTRIES = 100_000
_span_memo: dict[bytes, Decoded] = {}
_event_memo: dict[bytes, tuple[bytes, bytes]] = {}
_ZERO_TRACE, _ZERO_SPAN = bytes(16), bytes(8)


def fragment(key: str, value: Any) -> bytes:
    """``"key":value`` as orjson writes it inside an object."""
    return orjson.dumps({key: value})[1:-1]


def _decodespan_attribute(raw: bytes) -> Decoded:
    """Decode one raw ``KeyValue`` of a span; ``ValueError`` names what is wrong."""
    try:
        kv = KeyValue.FromString(raw)
    except DecodeError as exc:
        raise ValueError(f"malformed attribute: {exc}") from None
    key, value = kv.key, kv.value
    which = value.WhichOneof("value")
    token_slot = _TOKEN_SLOTS.get(key)
    if token_slot is not None:
        try:
            return TOKEN0 - token_slot[0], key, _token_bytes(value, which, token_slot[1])
        except (ValueError, TypeError, OverflowError) as exc:
            raise ValueError(f"attribute {key!r}: {exc}") from None
    alias_slot = _ALIAS_SLOTS.get(key)
    if alias_slot is not None:
        try:
            return TOKEN0 - alias_slot[0], key, _token_bytes(value, which, alias_slot[1])
        except (ValueError, TypeError, OverflowError):
            pass  # not token ids after all: keep it in the JSON attributes
    raw_value = any_value(value)
    slot = _SCALAR_SLOTS.get(key)
    if slot is not None and raw_value is not None:
        try:
            return slot[0], key, _coerce(raw_value, slot[1])
        except (ValueError, TypeError, OverflowError):
            pass  # keep the odd value in the JSON attributes instead
    return REST, key, fragment(key, raw_value)


def _packed_token(raw: bytes) -> Decoded | None:
    """Fast path for a packed token attribute in canonical encoding; ``None`` if it is anything else."""
    n = raw[1]
    token_slot = _TOKEN_KEYS_UTF8.get(raw[2 : 2 + n]) if n < 0x80 else None
    if token_slot is None:
        return None
    header = _token_headers.get((n, len(raw)))
    if header is None:
        header = _token_headers[(n, len(raw))] = _token_header(n, len(raw))
    if header is None or not raw.startswith(header[0], 0) or not raw.startswith(header[1], 2 + n):
        return None
    return TOKEN0 - token_slot[0], "", raw[len(header[0]) + n + len(header[1]) :]


def _token_header(key_len: int, total: int) -> tuple[bytes, bytes] | None:
    """The canonical bytes around the key of a ``bytes_value`` KeyValue of ``total`` bytes."""
    for size in range(total, -1, -1):
        inner = b"\x3a" + _encode_varint(size)
        outer = b"\x12" + _encode_varint(len(inner) + size)
        if 2 + key_len + len(outer) + len(inner) + size == total:
            return (b"\x0a" + bytes([key_len]), outer + inner) if size % 4 == 0 else None
        if 2 + key_len + len(outer) + len(inner) + size < total:
            return None
    return None


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_token_headers: dict[tuple[int, int], tuple[bytes, bytes] | None] = {}


def span_attribute(raw: bytes) -> Decoded:
    """Decode (and cache, when short) one raw span attribute."""
    if len(raw) > _MEMO_MAX_BYTES:
        return _packed_token(raw) or _decodespan_attribute(raw)
    decoded = _decodespan_attribute(raw)
    if len(_span_memo) >= _MEMO_MAX_ENTRIES:
        _span_memo.clear()
    _span_memo[raw] = decoded
    return decoded


def _event_json(raw: bytes) -> bytes:
    """One raw ``Span.Event`` as JSON; the part after the timestamp is cached by its bytes."""
    if 9 <= len(raw) <= _MEMO_MAX_BYTES and raw[0] == 0x09:  # canonical: fixed64 time first
        template = _event_memo.get(raw[9:])
        if template is None:
            template = event_template(RawEvent.FromString(raw))
            if len(_event_memo) >= _MEMO_MAX_ENTRIES:
                _event_memo.clear()
            _event_memo[raw[9:]] = template
        return template[0] + b"%d" % int.from_bytes(raw[1:9], "little") + template[1]
    event = RawEvent.FromString(raw)
    head, tail = event_template(event)
    return head + b"%d" % event.time_unix_nano + tail


def event_template(event: Any) -> tuple[bytes, bytes]:
    """JSON of an event before and after its ``time_unix_nano`` value."""
    fragments: dict[str, bytes] = {}
    for raw in event.attributes:
        try:
            kv = KeyValue.FromString(raw)
        except DecodeError as exc:
            raise ValueError(f"malformed event attribute: {exc}") from None
        fragments[kv.key] = fragment(kv.key, any_value(kv.value))
    head = b'{"name":%b,"time_unix_nano":' % orjson.dumps(event.name)
    return head, b',"attributes":{%b}}' % b",".join(fragments.values())


def request_to_table(request: ExportTraceServiceRequest, received_at_ns: int) -> ConversionResult:
    """Convert every valid span of ``request``; spans with missing/invalid ids are rejected and counted."""
    return body_to_table(request.SerializeToString(), received_at_ns)


def body_to_table(body: bytes, received_at_ns: int) -> ConversionResult:
    """Like :func:`request_to_table` for serialized request bytes; ``DecodeError`` if malformed.

    The compiled fast path (``otlp_fast``, when numba is installed) converts what exporters usually
    send; anything it does not reproduce exactly goes through :func:`reference_body_to_table`.
    """
    fast = fast_converter()
    result = fast.convert(body, received_at_ns) if fast is not None else None
    return result or reference_body_to_table(body, received_at_ns)


@functools.cache
def fast_converter() -> ModuleType | None:
    """The ``otlp_fast`` module when numba is installed (the ``collector`` extra), else ``None``."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return None
    from tinkertrace.spanstore import otlp_fast  # it imports this module: import on first use

    return otlp_fast


def warm_up_kernels() -> bool:
    """Compile (first run after an install, ~15 s) or load from numba's cache the compiled kernels: the
    span scan and the Parquet page gather. ``False`` when numba is not installed."""
    fast = fast_converter()
    if fast is None:
        return False
    from tinkertrace.spanstore import parquet_lists

    fast.warm_up()
    parquet_lists.warm_up()
    return True


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


MAX_TIME_NS = 2**63 - 1  # the timestamp columns are int64 nanoseconds (until the year 2262)


def time_problem(start_ns: int, end_ns: int) -> str | None:
    """Why a span's times cannot be stored (``None`` if they can)."""
    for name, value in (("start_time_unix_nano", start_ns), ("end_time_unix_nano", end_ns)):
        if value > MAX_TIME_NS:
            return f"{name} {value} is beyond the largest storable time (2^63-1 ns)"
    return None


def resource_columns(resource: Any) -> tuple[str | None, str]:
    """``service_name`` and ``resource_attributes`` (JSON) of an OTLP ``Resource``."""
    attributes = _attrs(resource.attributes)
    service = attributes.get("service.name")
    return (service if isinstance(service, str) else None), _dumps(attributes)


def reference_body_to_table(body: bytes, received_at_ns: int) -> ConversionResult:
    """The reference decoder: every valid OTLP encoding, exact error messages, Python per span."""
    request = RawExportTraceServiceRequest.FromString(body)
    rows: list[tuple[Any, ...]] = []
    errors: list[str] = []
    rejected = 0
    n_scalar = len(_SCALAR_SLOTS)
    n_kinds, n_status = len(KINDS), len(STATUSES)
    memo_get = _span_memo.get
    for r_index, resource_spans in enumerate(request.resource_spans):
        service, resource_json = resource_columns(resource_spans.resource)
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
                tokens: list[Any] = [None] * (len(_TOKEN_SLOTS) + len(_ALIAS_SLOTS))
                rest: dict[str, bytes] = {}
                events_json = links_json = "[]"
                if problem is None:
                    try:
                        for raw in span.attributes:
                            slot, key, value = memo_get(raw) or span_attribute(raw)
                            if slot >= 0:
                                lifted[slot] = value
                            elif slot == REST:
                                rest[key] = value
                            else:
                                tokens[TOKEN0 - slot] = value
                        _resolve_aliases(tokens)
                        events = span.events
                        if events:
                            events_json = (b"[%b]" % b",".join([_event_json(e) for e in events])).decode()
                        if span.links:
                            links_json = _links_json(span.links)
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


def _resolve_aliases(tokens: list[Any]) -> None:
    """Fill the token slots a span left empty from its alias slots (the extra ones, in order), then drop
    those."""
    aliases = tokens[len(_TOKEN_SLOTS) :]
    del tokens[len(_TOKEN_SLOTS) :]
    for target, alias in zip(_ALIAS_TARGETS, aliases, strict=True):
        if tokens[target] is None:
            tokens[target] = alias


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
        elif f.name in TOKEN_DTYPES_BY_NAME:
            arrays.append(_list_column(cols[f.name], f.type.value_type))
        elif f.name in ("start_time", "end_time"):
            arrays.append(pa.array(np.asarray(cols[f.name], dtype=np.int64)).cast(f.type))
        else:
            arrays.append(pa.array(list(cols[f.name]), type=f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


TOKEN_DTYPES_BY_NAME = {column: dtype for column, dtype in TOKEN_COLUMNS.values()}
