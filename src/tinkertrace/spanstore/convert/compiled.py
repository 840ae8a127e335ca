"""The compiled decoder: OTLP request bytes → spans table through the numba scan (``compiled_kernels``).

:func:`convert` runs :func:`compiled_kernels.scan` (offsets of every span field, attribute and event),
then builds each column with one kernel call or Arrow compute call. Python work is per *distinct*
attribute or event shape (decoded once by ``values``, then cached), never per span. It reproduces the
reference decoder's output exactly (tests/spanstore/test_compiled_conversion.py compares the two) and
raises :class:`Declined`, naming why, for anything it does not take; the dispatcher
(``spanstore.convert``) then uses the reference decoder and counts the reason.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.message import DecodeError
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from tinkertrace.schemas import spans as spans_schema
from tinkertrace.spanstore.convert import buffers, values
from tinkertrace.spanstore.convert import compiled_kernels as k
from tinkertrace.spanstore.convert import reference as ref
from tinkertrace.spanstore.convert.raw_proto import RawEvent
from tinkertrace.spanstore.encoding import lists_from_packed

# lifted attribute keys in slot order: the scalar columns, the three token columns, their aliases
_SLOT_KEYS = [*values.SCALAR_LIFTS, *values.TOKEN_LIFTS, *values.TOKEN_ALIASES]
_SCALAR_KINDS = [kind for _, kind in values.SCALAR_LIFTS.values()]  # of the first slots, in order
_SLOT_KIND = {"str": k.V_STRING, "int32": k.V_INT, "int": k.V_INT, "float": k.V_DOUBLE}
_TOKEN_KINDS = [
    k.V_BYTES + (k.FLOAT_TOKENS if np.dtype(dtype).kind == "f" else 0)
    for _, dtype in values.TOKEN_LIFTS.values()
]
_TOKEN_SLOT = {key: len(_SCALAR_KINDS) + i for i, key in enumerate(values.TOKEN_LIFTS)}
# (alias slot, the token slot it fills when a span lacks that one)
_ALIASES = [(_SLOT_KEYS.index(alias), _TOKEN_SLOT[key]) for alias, key in values.TOKEN_ALIASES.items()]
_ALIAS_KINDS = [_TOKEN_KINDS[target - len(_SCALAR_KINDS)] for _, target in _ALIASES]
_LIFTED_KINDS = np.array(
    [_SLOT_KIND[kind] for kind in _SCALAR_KINDS] + _TOKEN_KINDS + _ALIAS_KINDS, dtype=np.int64
)
_KEY_TABLE = k.key_table(_SLOT_KEYS)
_N_SLOTS = len(_SLOT_KEYS)
_NUMBER_SLOTS = [slot for slot, kind in enumerate(_SCALAR_KINDS) if kind != "str"]


def _slot_columns(slot: int) -> tuple[int, int]:
    return k.S_LIFTED + k.L_WIDTH * slot + k.L_VAL, k.S_LIFTED + k.L_WIDTH * slot + k.L_LEN


# the columns copied out of the body by one kernel call: (column, list type or None for strings, span
# matrix columns of the value's offset and length). A negative length is a null; the status message
# is also null when empty.
_GATHERED: list[tuple[str, pa.DataType | None, int, int]] = [
    ("name", None, k.S_NAME, k.S_NAME_LEN),
    ("status_message", None, k.S_STATUS_MSG, k.S_STATUS_MSG_LEN),
    *[
        (column, None, *_slot_columns(slot))
        for slot, (column, kind) in enumerate(values.SCALAR_LIFTS.values())
        if kind == "str"
    ],
    *[
        (column, pa.list_(pa.from_numpy_dtype(dtype)), *_slot_columns(len(_SCALAR_KINDS) + i))
        for i, (column, dtype) in enumerate(values.TOKEN_LIFTS.values())
    ],
]
_TOKEN_ROWS = [i for i, (_, list_type, _, _) in enumerate(_GATHERED) if list_type is not None]
_GATHERED_VALUES = np.array([value for *_, value, _ in _GATHERED], dtype=np.int64)
_GATHERED_LENGTHS = np.array([length for *_, length in _GATHERED], dtype=np.int64)
_STATUS_MESSAGE = 1  # its row among the gathered columns
_KIND_NAMES = pa.array(ref.KINDS)
_STATUS_NAMES = pa.array(ref.STATUSES)
_ARROW_TYPES = {"int32": pa.int32(), "int": pa.int64(), "float": pa.float64()}


_WIDTHS = (k.S_LIFTED + k.L_WIDTH * _N_SLOTS, k.A_WIDTH, k.E_WIDTH, k.G_WIDTH)


def _capacity(body_size: int) -> list[int]:
    """Matrix sizes that fit typical requests (spans >= 256 bytes, attributes >= 64, events >= 256)."""
    return [body_size // 256 + 16, body_size // 64 + 64, body_size // 256 + 16, 16]


_scratch = threading.local()


def _scratch_matrices(sizes: list[int]) -> list[np.ndarray]:
    """This thread's scan matrices, grown to at least ``sizes`` rows (reused: no page faults)."""
    matrices: list[np.ndarray] | None = getattr(_scratch, "matrices", None)
    if matrices is None or any(len(m) < size for m, size in zip(matrices, sizes, strict=True)):
        rows = (
            sizes
            if matrices is None
            else [max(len(m), size) for m, size in zip(matrices, sizes, strict=True)]
        )
        matrices = [np.empty((n, width), dtype=np.int64) for n, width in zip(rows, _WIDTHS, strict=True)]
        _scratch.matrices = matrices
    return matrices


class Declined(Exception):
    """A request this decoder does not reproduce exactly; ``reason`` says why (a short, fixed text)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


SCAN_DECLINED = "encoding outside the scanned subset"
ATTRIBUTE_DECLINED = "attribute outside the compiled subset"


def convert(body: bytes, received_at_ns: int) -> ref.ConversionResult:
    """Convert a serialized request; :class:`Declined` if it needs the reference decoder."""
    buf = np.frombuffer(body, dtype=np.uint8)
    sizes = _capacity(len(body))
    while True:
        matrices = _scratch_matrices(sizes)
        status, *counts = k.scan(buf, *_KEY_TABLE, _LIFTED_KINDS, *matrices)
        if status != k.OK:
            raise Declined(SCAN_DECLINED)
        if all(c <= len(m) for c, m in zip(counts, matrices, strict=True)):
            break
        sizes = counts  # a request denser than the estimate: scan again with exact sizes
    spans, attrs, events, groups = (m[:c] for m, c in zip(matrices, counts, strict=True))
    try:
        keep, errors = _check_ids(body, spans, groups)
        rows = spans[keep]  # a copy: Arrow arrays may keep views of it, the scratch matrix is reused
        _resolve_aliases(rows)
        columns = {
            **_id_and_span_columns(buf, rows),
            **_group_columns(body, groups, rows[:, k.S_GROUP]),
            **_gathered_columns(buf, rows),
            **_number_columns(rows),
            "attributes": _attributes_json(buf, rows, attrs),
            "events": _events_json(buf, rows, events),
            "links": buffers.constant_strings(b"[]", len(rows)),
        }
        n = len(rows)
        columns["received_at"] = buffers.timestamps(np.full(n, received_at_ns, dtype=np.int64))
        schema = spans_schema()
        arrays = [columns[f.name] for f in schema]
        table = pa.Table.from_arrays(
            [a if a.type == f.type else a.cast(f.type) for a, f in zip(arrays, schema, strict=True)],
            schema=schema,
        )
    except (DecodeError, ValueError, TypeError, pa.ArrowInvalid) as exc:  # the reference names the problem
        raise Declined(type(exc).__name__) from exc
    return ref.ConversionResult(
        table=table, accepted=n, rejected=len(spans) - n, errors=errors, decoder="compiled"
    )


def _resolve_aliases(rows: np.ndarray) -> None:
    """Where a span has an alias token attribute (another producer's key) and not ours, take the alias's
    value (its L_WIDTH lifted columns) for ours, as the reference decoder does. In place."""
    for alias, target in _ALIASES:
        alias_at, target_at = k.S_LIFTED + k.L_WIDTH * alias, k.S_LIFTED + k.L_WIDTH * target
        use = (rows[:, alias_at + k.L_LEN] >= 0) & (rows[:, target_at + k.L_LEN] < 0)
        if use.any():
            rows[use, target_at : target_at + k.L_WIDTH] = rows[use, alias_at : alias_at + k.L_WIDTH]


def _check_ids(body: bytes, spans: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Rows with valid ids, and the reference decoder's messages for the first rejected ones."""
    trace_len, span_len = spans[:, k.S_TRACE_LEN], spans[:, k.S_SPAN_LEN]
    parent_len, zero = spans[:, k.S_PARENT_LEN], spans[:, k.S_ZERO_IDS]
    bad = (trace_len != 16) | ((zero & 1) > 0) | (span_len != 8) | ((zero & 2) > 0)
    bad |= (parent_len != 0) & (parent_len != 8)
    errors = []
    for row in spans[np.flatnonzero(bad)[: ref.MAX_ERRORS]]:
        problem = ref.id_problem(
            int(row[k.S_TRACE_LEN]), bool(row[k.S_ZERO_IDS] & 1), int(row[k.S_SPAN_LEN]),
            bool(row[k.S_ZERO_IDS] & 2), int(row[k.S_PARENT_LEN]),
        )  # fmt: skip
        name = _text(body, row[k.S_NAME], row[k.S_NAME_LEN])
        where = f"resource_spans[{groups[row[k.S_GROUP], k.G_RESOURCE_SPANS]}] span[{row[k.S_INDEX]}]"
        errors.append(f"{where} name={name!r}: {problem}")
    return ~bad, errors


def _text(body: bytes, offset: int, length: int) -> str:
    return body[offset : offset + length].decode() if length > 0 else ""


def _id_and_span_columns(buf: np.ndarray, rows: np.ndarray) -> dict[str, pa.Array]:
    everywhere = np.ones(len(rows), dtype=bool)
    has_parent = rows[:, k.S_PARENT_LEN] == 8
    kind, code = rows[:, k.S_KIND], rows[:, k.S_STATUS_CODE]
    kind = np.where((kind >= 0) & (kind < len(ref.KINDS)), kind, 0)
    code = np.where((code >= 0) & (code < len(ref.STATUSES)), code, 0)
    return {
        "trace_id": buffers.hex_ids(buf, rows[:, k.S_TRACE], everywhere, 16),
        "span_id": buffers.hex_ids(buf, rows[:, k.S_SPAN], everywhere, 8),
        "parent_span_id": buffers.hex_ids(buf, rows[:, k.S_PARENT], has_parent, 8),
        "kind": _KIND_NAMES.take(pa.array(kind)),
        "start_time": buffers.timestamps(rows[:, k.S_START]),
        "end_time": buffers.timestamps(rows[:, k.S_END]),
        "status_code": _STATUS_NAMES.take(pa.array(code)),
    }


def _group_columns(body: bytes, groups: np.ndarray, row_groups: np.ndarray) -> dict[str, pa.Array]:
    """service_name, scope_name and resource_attributes: decoded once per (resource, scope)."""
    services, scopes, resources = [], [], []
    for group in groups:
        resource = Resource.FromString(_slice(body, group[k.G_RESOURCE], group[k.G_RESOURCE_LEN]))
        service, resource_json = values.resource_columns(resource)
        scope = InstrumentationScope.FromString(_slice(body, group[k.G_SCOPE], group[k.G_SCOPE_LEN]))
        services.append(service)
        scopes.append(scope.name or None)
        resources.append(resource_json)
    return {
        "service_name": _per_group(services, row_groups),
        "scope_name": _per_group(scopes, row_groups),
        "resource_attributes": _per_group(resources, row_groups),
    }


def _per_group(values: Sequence[str | None], row_groups: np.ndarray) -> pa.Array:
    """Each row's group value; one group (the usual request) needs no Arrow ``take``."""
    if len(values) == 1 and values[0] is not None:
        return buffers.constant_strings(values[0].encode(), len(row_groups))
    if len(values) == 1:
        return pa.nulls(len(row_groups), pa.string())
    return pa.array(values, pa.string()).take(pa.array(row_groups))


def _slice(body: bytes, offset: int, length: int) -> bytes:
    return body[offset : offset + length] if offset >= 0 else b""


def _gathered_columns(buf: np.ndarray, rows: np.ndarray) -> dict[str, pa.Array]:
    """The string and token columns whose bytes come straight from the body (see ``_GATHERED``), copied
    by one kernel call: the per-call overhead, not the bytes, is most of the conversion's cost for
    small requests. Each column gets its own slice of the gathered bytes."""
    lengths = rows.T[_GATHERED_LENGTHS]  # a copy (fancy indexing): writable
    message = lengths[_STATUS_MESSAGE]
    message[message == 0] = -1
    present = lengths >= 0
    arrays = {  # token columns with plain OTel arrays: decoded by their own kernel, not copied here
        i: lengths[i].copy()
        for i in _TOKEN_ROWS
        if (rows[:, _GATHERED[i][2] + k.L_VTYPE - k.L_VAL] == k.V_ARRAY).any()
    }
    for i in arrays:
        lengths[i] = -1
    data, offsets, starts = k.gather_columns(buf, rows.T[_GATHERED_VALUES], lengths)
    complete = np.all(present, axis=1)
    columns: dict[str, pa.Array] = {}
    for i, (column, list_type, value_at, _) in enumerate(_GATHERED):
        values, validity = data[starts[i] : starts[i + 1]], None if complete[i] else present[i]
        if list_type is None:
            columns[column] = buffers.strings(values, offsets[i], validity)
            continue
        if i in arrays:
            values, row_offsets = _packed_tokens(buf, rows, value_at, arrays[i], list_type)
        else:
            row_offsets = offsets[i]
        packed = [buffers.validity_bitmap(validity), pa.py_buffer(row_offsets), pa.py_buffer(values)]
        columns[column] = lists_from_packed(pa.Array.from_buffers(pa.binary(), len(rows), packed), list_type)
    return columns


def _packed_tokens(
    buf: np.ndarray, rows: np.ndarray, value_at: int, lengths: np.ndarray, list_type: pa.DataType
) -> tuple[np.ndarray, np.ndarray]:
    """A token column some of whose rows are plain OTel arrays, as packed bytes and int32 byte offsets
    per row: packed rows copied, array rows decoded (``compiled_kernels.pack_tokens``)."""
    kinds = rows[:, value_at + k.L_VTYPE - k.L_VAL]
    counts = rows[:, value_at + k.L_NUM - k.L_VAL]
    sizes = np.where(kinds == k.V_ARRAY, 4 * counts, np.maximum(lengths, 0))
    row_offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(sizes, out=row_offsets[1:])
    out = np.empty(int(row_offsets[-1]), dtype=np.uint8)
    floats = pa.types.is_floating(list_type.value_type)
    empty = np.empty(0, dtype=np.uint8)
    ints, reals = (empty, out) if floats else (out, empty)
    k.pack_tokens(
        buf, rows[:, value_at], lengths, kinds, row_offsets, out, ints.view(np.int32), reals.view(np.float32)
    )
    return out, row_offsets


def _number_columns(rows: np.ndarray) -> dict[str, pa.Array]:
    columns: dict[str, pa.Array] = {}
    for slot in _NUMBER_SLOTS:
        at = k.S_LIFTED + k.L_WIDTH * slot
        column, kind = values.SCALAR_LIFTS[_SLOT_KEYS[slot]]
        numbers = rows[:, at + k.L_NUM]
        if kind == "float":
            doubles = rows[:, at + k.L_VTYPE] == k.V_DOUBLE
            numbers = np.where(doubles, numbers.view(np.float64), numbers.astype(np.float64))
        columns[column] = pa.array(numbers, type=_ARROW_TYPES[kind], mask=rows[:, at + k.L_LEN] < 0)
    return columns


def _attributes_json(buf: np.ndarray, rows: np.ndarray, attrs: np.ndarray) -> pa.Array:
    """JSON of the attributes not lifted into columns: one decode per distinct raw KeyValue, except
    for integers (token counts vary from span to span): the join kernel writes their digits after
    their key's ``"key":``, decoded once per distinct key."""
    other = attrs[:, k.A_SLOT] < 0
    numeric = other & (attrs[:, k.A_VTYPE] == k.V_INT)
    whole, keyed = np.flatnonzero(other & ~numeric), np.flatnonzero(numeric)
    item_fragment = np.full(len(attrs), -1, dtype=np.int64)
    fragments, (data, offsets) = _distinct(buf, attrs[whole, k.A_OFF], attrs[whole, k.A_LEN], _fragment, 1)
    item_fragment[whole] = fragments
    if len(keyed):
        prefixes, (key_data, key_offsets) = _distinct(
            buf, attrs[keyed, k.A_KEY], attrs[keyed, k.A_KEY_LEN], _number_prefix, 1
        )
        item_fragment[keyed] = prefixes + len(offsets) - 1
        data = np.concatenate([data, key_data])
        offsets = np.concatenate([offsets, key_offsets[1:] + offsets[-1]])
    data, offsets = k.join_fragments(
        rows[:, k.S_ATTR_FIRST], rows[:, k.S_ATTR_COUNT], item_fragment, data, offsets,
        numeric, attrs[:, k.A_NUM],
    )  # fmt: skip
    return buffers.strings(data, offsets)


@functools.lru_cache(maxsize=100_000)
def _fragment(raw: bytes) -> tuple[bytes]:
    """``"key":value`` JSON of a raw KeyValue that is not lifted into a column."""
    slot, _, value = values.span_attribute(raw)
    if slot != values.REST:
        raise Declined(ATTRIBUTE_DECLINED)
    return (value,)


@functools.lru_cache(maxsize=10_000)
def _number_prefix(key: bytes) -> tuple[bytes]:
    """``"key":`` JSON of an integer attribute that is not lifted into a column (as the reference
    decoder writes it: ``values.fragment`` of the key and a one-digit number, without the digit)."""
    try:
        return (values.fragment(key.decode(), 0)[:-1],)
    except UnicodeDecodeError:  # the reference decoder rejects it with its own message
        raise Declined(ATTRIBUTE_DECLINED) from None


def _events_json(buf: np.ndarray, rows: np.ndarray, events: np.ndarray) -> pa.Array:
    """JSON of each span's events: one template per distinct event (bytes after the timestamp)."""
    templates, (heads, head_offsets, tails, tail_offsets) = _distinct(
        buf, events[:, k.E_OFF] + 9, events[:, k.E_LEN] - 9, _event_template, 2
    )
    data, offsets = k.join_events(
        rows[:, k.S_EVENT_FIRST], rows[:, k.S_EVENT_COUNT], templates, events[:, k.E_TIME],
        heads, head_offsets, tails, tail_offsets,
    )  # fmt: skip
    return buffers.strings(data, offsets)


@functools.lru_cache(maxsize=100_000)
def _event_template(tail: bytes) -> tuple[bytes, bytes]:
    """JSON before and after the timestamp of an event whose bytes after the timestamp are ``tail``."""
    return values.event_template(RawEvent.FromString(b"\x09" + bytes(8) + tail))


def _distinct(
    buf: np.ndarray,
    offsets: np.ndarray,
    lengths: np.ndarray,
    decode: Callable[[bytes], tuple[bytes, ...]],
    n_parts: int,
) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """Each item's index among the distinct byte strings, and per part of ``decode(distinct)``
    the concatenated bytes and offsets (``decode`` runs once per distinct value, and is cached)."""
    data, item_offsets, _ = k.gather_columns(buf, offsets[np.newaxis], lengths[np.newaxis])
    raw = pa.Array.from_buffers(
        pa.binary(), len(lengths), [None, pa.py_buffer(item_offsets[0]), pa.py_buffer(data)]
    )
    encoded = pc.dictionary_encode(raw)
    decoded = [decode(value) for value in encoded.dictionary.to_pylist()]
    parts: list[np.ndarray] = []
    for i in range(n_parts):
        pieces = [d[i] for d in decoded]
        parts.append(np.frombuffer(b"".join(pieces), dtype=np.uint8))
        # a handful of distinct values: a Python running sum beats numpy's conversion of the list
        parts.append(np.array(list(itertools.accumulate(map(len, pieces), initial=0)), dtype=np.int64))
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64), tuple(parts)
