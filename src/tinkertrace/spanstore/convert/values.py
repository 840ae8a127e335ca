"""Decoding one span attribute or event: the per-value semantics both decoders share.

An attribute named in ``schemas.columns`` is lifted into its column (scalars coerced to the column's
type, token arrays as packed little-endian bytes); any other attribute becomes a ``"key":value`` JSON
fragment of the ``attributes`` column. Events become JSON text. Short attributes and events mostly
repeat from span to span, so their decoding is cached by their raw bytes.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
from google.protobuf.message import DecodeError
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from tinkertrace.schemas import spans as spans_schema
from tinkertrace.schemas.columns import SCALAR_ATTRIBUTES, TOKEN_ALIASES, TOKEN_ATTRIBUTES
from tinkertrace.spanstore.convert.raw_proto import RawEvent

# the coercion of a lifted scalar, by its column's type
_KIND_OF_TYPE = {pa.string(): "str", pa.int32(): "int32", pa.int64(): "int", pa.float64(): "float"}
# attribute key -> (column, coercion kind: "str", "int32", "int" or "float")
SCALAR_LIFTS: dict[str, tuple[str, str]] = {
    key: (column, _KIND_OF_TYPE[spans_schema().field(column).type])
    for key, column in SCALAR_ATTRIBUTES.items()
}
# attribute key -> (column, little-endian dtype of its values)
TOKEN_LIFTS: dict[str, tuple[str, np.dtype]] = {
    key: (column, np.dtype(spans_schema().field(column).type.value_type.to_pandas_dtype()).newbyteorder("<"))
    for key, column in TOKEN_ATTRIBUTES.items()
}


def dumps(obj: Any) -> str:
    """Compact JSON text (orjson: ~10x faster than json.dumps, which matters per span)."""
    return orjson.dumps(obj).decode()


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


def attributes_dict(key_values: Any) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in key_values}


def resource_columns(resource: Any) -> tuple[str | None, str]:
    """``service_name`` and ``resource_attributes`` (JSON) of an OTLP ``Resource``."""
    attributes = attributes_dict(resource.attributes)
    service = attributes.get("service.name")
    return (service if isinstance(service, str) else None), dumps(attributes)


def links_json(links: Any) -> str:
    """JSON of a span's links."""
    if not links:
        return "[]"
    return dumps(
        [
            {
                "trace_id": lk.trace_id.hex(),
                "span_id": lk.span_id.hex(),
                "attributes": attributes_dict(lk.attributes),
            }
            for lk in links
        ],
    )


def _coerce(raw: Any, kind: str) -> Any:
    """Coerce a lifted attribute to its column type; ``ValueError``/``TypeError`` if impossible."""
    if kind == "str":
        return raw if isinstance(raw, str) else dumps(raw)
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


# attribute key -> (slot in the lifted list, coercion kind); token key -> (slot, dtype)
SCALAR_SLOTS = {key: (i, kind) for i, (key, (_, kind)) in enumerate(SCALAR_LIFTS.items())}
TOKEN_SLOTS = {key: (i, dtype) for i, (key, (_, dtype)) in enumerate(TOKEN_LIFTS.items())}
# an alias decodes into token slot len(TOKEN_LIFTS) + its index; resolved per span by resolve_aliases
ALIAS_SLOTS = {
    alias: (len(TOKEN_LIFTS) + i, TOKEN_SLOTS[key][1]) for i, (alias, key) in enumerate(TOKEN_ALIASES.items())
}
_ALIAS_TARGETS = [TOKEN_SLOTS[key][0] for key in TOKEN_ALIASES.values()]
_TOKEN_KEYS_UTF8 = {key.encode(): (i, dtype) for key, (i, dtype) in TOKEN_SLOTS.items()}

# A decoded attribute: (slot, key, value). slot >= 0: lifted scalar column, value its typed value;
# slot == REST: value is the ``"key":value`` JSON fragment; slot <= TOKEN0: token column TOKEN0 - slot,
# value its packed bytes.
REST, TOKEN0 = -1, -2
Decoded = tuple[int, str, Any]
_MEMO_MAX_BYTES = 160  # attributes this short are cached by their raw bytes (they mostly repeat)
_MEMO_MAX_ENTRIES = 100_000
span_memo: dict[bytes, Decoded] = {}
event_memo: dict[bytes, tuple[bytes, bytes]] = {}


def fragment(key: str, value: Any) -> bytes:
    """``"key":value`` as orjson writes it inside an object."""
    return orjson.dumps({key: value})[1:-1]


def _decode_span_attribute(raw: bytes) -> Decoded:
    """Decode one raw ``KeyValue`` of a span; ``ValueError`` names what is wrong."""
    try:
        kv = KeyValue.FromString(raw)
    except DecodeError as exc:
        raise ValueError(f"malformed attribute: {exc}") from None
    key, value = kv.key, kv.value
    which = value.WhichOneof("value")
    token_slot = TOKEN_SLOTS.get(key)
    if token_slot is not None:
        try:
            return TOKEN0 - token_slot[0], key, _token_bytes(value, which, token_slot[1])
        except (ValueError, TypeError, OverflowError) as exc:
            raise ValueError(f"attribute {key!r}: {exc}") from None
    alias_slot = ALIAS_SLOTS.get(key)
    if alias_slot is not None:
        try:
            return TOKEN0 - alias_slot[0], key, _token_bytes(value, which, alias_slot[1])
        except (ValueError, TypeError, OverflowError):
            pass  # not token ids after all: keep it in the JSON attributes
    raw_value = any_value(value)
    slot = SCALAR_SLOTS.get(key)
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
        return _packed_token(raw) or _decode_span_attribute(raw)
    decoded = _decode_span_attribute(raw)
    if len(span_memo) >= _MEMO_MAX_ENTRIES:
        span_memo.clear()
    span_memo[raw] = decoded
    return decoded


def resolve_aliases(tokens: list[Any]) -> None:
    """Fill the token slots a span left empty from its alias slots (the extra ones, in order), then drop
    those."""
    aliases = tokens[len(TOKEN_SLOTS) :]
    del tokens[len(TOKEN_SLOTS) :]
    for target, alias in zip(_ALIAS_TARGETS, aliases, strict=True):
        if tokens[target] is None:
            tokens[target] = alias


def event_json(raw: bytes) -> bytes:
    """One raw ``Span.Event`` as JSON; the part after the timestamp is cached by its bytes."""
    if 9 <= len(raw) <= _MEMO_MAX_BYTES and raw[0] == 0x09:  # canonical: fixed64 time first
        template = event_memo.get(raw[9:])
        if template is None:
            template = event_template(RawEvent.FromString(raw))
            if len(event_memo) >= _MEMO_MAX_ENTRIES:
                event_memo.clear()
            event_memo[raw[9:]] = template
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
