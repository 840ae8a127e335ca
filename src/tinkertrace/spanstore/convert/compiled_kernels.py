"""Compiled (numba) kernels that scan a serialized OTLP trace request into column buffers.

:func:`scan` walks the protobuf wire format of an ``ExportTraceServiceRequest`` once and records,
as offsets into the body, every span's fields, every attribute's key and value and every event:
no Python object per span or attribute. The other kernels turn those offsets into Arrow buffers
(strings, lowercase hex ids, packed token arrays, JSON text). ``compiled`` assembles the table.

The scan accepts the encodings exporters write. It answers :data:`GENERAL` for anything else
(links, a group wire type, a field with an unexpected wire type, a ``KeyValue`` or ``AnyValue`` with
repeated or unknown fields, a lifted attribute of an unexpected type, token arrays that are not
packed bytes, repeated attribute keys, events without a leading timestamp, trace state that is not
ASCII, timestamps beyond int64) and for malformed bytes: the caller then converts the request with the
reference decoder (``reference``), which has the exact semantics and error messages.
Compiled functions are cached next to this file (``cache=True``), so only the first start compiles.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

OK, GENERAL = 0, 1

# columns of the span matrix
(
    S_GROUP,  # index of the (resource, scope) group
    S_INDEX,  # index of the span within its scope
    S_TRACE,
    S_TRACE_LEN,
    S_SPAN,
    S_SPAN_LEN,
    S_PARENT,
    S_PARENT_LEN,
    S_NAME,
    S_NAME_LEN,
    S_KIND,
    S_START,
    S_END,
    S_STATUS_CODE,
    S_STATUS_MSG,
    S_STATUS_MSG_LEN,
    S_ATTR_FIRST,
    S_ATTR_COUNT,
    S_EVENT_FIRST,
    S_EVENT_COUNT,
    S_ZERO_IDS,  # bit 1: trace id all zero, bit 2: span id all zero
    S_LIFTED,  # first of the lifted-attribute columns: L_WIDTH columns per known key
) = range(22)
# the lifted columns of one key, at S_LIFTED + L_WIDTH * slot: value start, length (-1: absent),
# number (int value, or the bits of a double), AnyValue kind
L_VAL, L_LEN, L_NUM, L_VTYPE, L_WIDTH = range(5)

# columns of the attribute matrix: the KeyValue bytes, its key, lifted slot (-1: other), AnyValue kind
# and number (as L_VTYPE, L_NUM); the values of lifted attributes go to the span matrix, the others
# are decoded from their bytes (integers: from the number)
A_OFF, A_LEN, A_KEY, A_KEY_LEN, A_SLOT, A_VTYPE, A_NUM, A_WIDTH = range(8)
# AnyValue kinds (the oneof field number; 0 = empty)
V_NONE, V_STRING, V_BOOL, V_INT, V_DOUBLE, V_ARRAY, V_KVLIST, V_BYTES = range(8)
# the lifted kind of a token slot: packed bytes, or a plain OTel array of ints (ids) or doubles
# (FLOAT_TOKENS added: logprobs); an array's element count goes to L_NUM
FLOAT_TOKENS = 8

# columns of the event matrix: the event bytes (its template is the part after the timestamp), time
E_OFF, E_LEN, E_TIME, E_WIDTH = range(4)

# columns of the group matrix: index of the ResourceSpans, resource and scope bytes (-1: absent)
G_RESOURCE_SPANS, G_RESOURCE, G_RESOURCE_LEN, G_SCOPE, G_SCOPE_LEN, G_WIDTH = range(6)

_ERR = -1


@njit(cache=True)
def _varint(buf: np.ndarray, pos: int, end: int) -> tuple[int, int]:
    """(value, next position); next position -1 if the varint is truncated or too long."""
    if pos < end and buf[pos] < 0x80:  # one byte: most tags and lengths
        return np.int64(buf[pos]), pos + 1
    result = 0
    shift = 0
    while pos < end and shift < 64:
        byte = np.int64(buf[pos])
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
    return 0, _ERR


@njit(cache=True)
def _fixed(buf: np.ndarray, pos: int, size: int) -> int:
    value = 0
    for i in range(size):
        value |= np.int64(buf[pos + i]) << (8 * i)
    return value


@njit(cache=True)
def _field(buf: np.ndarray, pos: int, end: int) -> tuple[int, int, int, int, int]:
    """Next field at ``pos``: (number, wire type, value or length, value start, next position).

    Next position is -1 for malformed bytes or a group wire type.
    """
    tag, pos = _varint(buf, pos, end)
    if pos < 0:
        return 0, 0, 0, 0, _ERR
    wire = tag & 7
    number = tag >> 3
    if number == 0 or number >= 1 << 29:  # not a valid field number
        return 0, 0, 0, 0, _ERR
    if wire == 0:
        value, nxt = _varint(buf, pos, end)
        return number, 0, value, pos, nxt
    if wire == 1:
        if pos + 8 > end:
            return 0, 0, 0, 0, _ERR
        return number, 1, _fixed(buf, pos, 8), pos, pos + 8
    if wire == 2:
        length, start = _varint(buf, pos, end)
        if start < 0 or length < 0 or start + length > end:
            return 0, 0, 0, 0, _ERR
        return number, 2, length, start, start + length
    if wire == 5:
        if pos + 4 > end:
            return 0, 0, 0, 0, _ERR
        return number, 5, _fixed(buf, pos, 4), pos, pos + 4
    return 0, 0, 0, 0, _ERR


@njit(cache=True)
def _int32(value: int) -> int:
    """Truncate a varint to int32 as protobuf does for int32/enum fields."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= (1 << 31) else value


def key_table(keys: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The lifted keys as the scan wants them: UTF-8 bytes, offsets, and the slot of each key length
    (-1: no key of that length, -2: several, compare them all)."""
    encoded = [key.encode() for key in keys]
    by_length = np.full(max(map(len, encoded), default=0) + 1, -1, dtype=np.int64)
    for slot, key in enumerate(encoded):
        by_length[len(key)] = slot if by_length[len(key)] == -1 else -2
    offsets = np.cumsum([0, *map(len, encoded)], dtype=np.int64)
    return np.frombuffer(b"".join(encoded), dtype=np.uint8), offsets, by_length


@njit(cache=True, inline="always")  # inlined: a call would count a reference to each array argument
def _scan_attribute(buf: np.ndarray, start: int, end: int) -> tuple[int, int, int, int, int, int, int]:
    """One KeyValue: (status, key, key length, value kind, value start, value length, number)."""
    pos = start
    key = value = -1
    key_len = value_len = 0
    while pos < end:
        number, wire, length, vstart, pos = _field(buf, pos, end)
        if pos < 0 or wire != 2:
            return GENERAL, 0, 0, 0, 0, 0, 0
        if number == 1 and key < 0:
            key, key_len = vstart, length
        elif number == 2 and value < 0:
            value, value_len = vstart, length
        else:
            return GENERAL, 0, 0, 0, 0, 0, 0
    if value < 0 or value_len == 0:
        return OK, key, key_len, V_NONE, 0, 0, 0
    vend = value + value_len
    number, wire, content, vstart, nxt = _field(buf, value, vend)
    if nxt != vend:  # malformed, or more than one field in the AnyValue
        return GENERAL, 0, 0, 0, 0, 0, 0
    if number in (V_STRING, V_ARRAY, V_KVLIST, V_BYTES) and wire == 2:
        return OK, key, key_len, number, vstart, content, 0
    if (number in (V_BOOL, V_INT) and wire == 0) or (number == V_DOUBLE and wire == 1):
        return OK, key, key_len, number, 0, 0, content
    return GENERAL, 0, 0, 0, 0, 0, 0


@njit(cache=True)
def _next_message(buf: np.ndarray, pos: int, end: int, number: int) -> tuple[int, int, int, int]:
    """The field at ``pos``: (status, start, length, next position); start -1 if it is another field
    than the message field ``number``."""
    found, wire, length, start, nxt = _field(buf, pos, end)
    if nxt < 0 or (found == number and wire != 2):
        return GENERAL, 0, 0, 0
    return OK, (start if found == number else -1), length, nxt


@njit(cache=True)
def _first_message(buf: np.ndarray, start: int, end: int) -> tuple[int, int, int]:
    """(status, start, length) of field 1 of a ResourceSpans or ScopeSpans (the resource or scope;
    start -1 if absent), checking that its ``schema_url`` (field 3) needs no UTF-8 validation."""
    found = -1
    found_len = 0
    pos = start
    while pos < end:
        number, wire, length, vstart, pos = _field(buf, pos, end)
        if pos < 0:
            return GENERAL, 0, 0
        if number == 1:
            if wire != 2 or found >= 0:
                return GENERAL, 0, 0
            found, found_len = vstart, length
        elif number == 3 and (wire != 2 or not _ascii(buf, vstart, pos)):
            return GENERAL, 0, 0
    return OK, found, found_len


@njit(cache=True)
def scan(
    buf: np.ndarray,
    keys: np.ndarray,
    key_offsets: np.ndarray,
    by_length: np.ndarray,
    lifted_kinds: np.ndarray,
    spans: np.ndarray,
    attrs: np.ndarray,
    events: np.ndarray,
    groups: np.ndarray,
) -> tuple[int, int, int, int, int]:
    """Walk a request; returns (status, spans, attributes, events, groups).

    Rows beyond a matrix's capacity are counted, not written: if a count exceeds its matrix, scan
    again with matrices of the returned sizes. ``keys``/``key_offsets``/``by_length`` are the lifted
    attribute keys (see :func:`key_table`); ``lifted_kinds[slot]`` is the AnyValue kind that slot accepts
    (V_DOUBLE accepts ints too).
    """
    n_keys = len(key_offsets) - 1
    n_span = n_attr = n_event = n_group = 0
    end = len(buf)
    pos = 0
    n_resource_spans = -1
    others = np.empty(64, np.int64)  # scratch of _scan_span: a span's attributes that are not lifted
    while pos < end:
        number, wire, rs_len, rs, pos = _field(buf, pos, end)
        if pos < 0:
            return GENERAL, 0, 0, 0, 0
        if number != 1:
            continue
        n_resource_spans += 1
        if wire != 2:
            return GENERAL, 0, 0, 0, 0
        rs_end = rs + rs_len
        status, resource, resource_len = _first_message(buf, rs, rs_end)
        if status != OK:
            return GENERAL, 0, 0, 0, 0
        p = rs
        while p < rs_end:
            status, ss, ss_len, p = _next_message(buf, p, rs_end, 2)
            if status != OK:
                return GENERAL, 0, 0, 0, 0
            if ss < 0:
                continue
            ss_end = ss + ss_len
            status, scope, scope_len = _first_message(buf, ss, ss_end)
            if status != OK:
                return GENERAL, 0, 0, 0, 0
            if n_group < groups.shape[0]:
                groups[n_group, G_RESOURCE_SPANS] = n_resource_spans
                groups[n_group, G_RESOURCE] = resource
                groups[n_group, G_RESOURCE_LEN] = resource_len
                groups[n_group, G_SCOPE] = scope
                groups[n_group, G_SCOPE_LEN] = scope_len
            q = ss
            index = 0
            while q < ss_end:
                status, sp, sp_len, q = _next_message(buf, q, ss_end, 2)
                if status != OK:
                    return GENERAL, 0, 0, 0, 0
                if sp < 0:
                    continue
                status = _scan_span(
                    buf,
                    sp,
                    sp + sp_len,
                    keys,
                    key_offsets,
                    by_length,
                    lifted_kinds,
                    n_keys,
                    spans,
                    attrs,
                    events,
                    n_span,
                    n_attr,
                    n_event,
                    others,
                )
                if status[0] != OK:
                    return GENERAL, 0, 0, 0, 0
                if n_span < spans.shape[0]:
                    spans[n_span, S_GROUP] = n_group
                    spans[n_span, S_INDEX] = index
                n_attr += status[1]
                n_event += status[2]
                n_span += 1
                index += 1
            n_group += 1
    return OK, n_span, n_attr, n_event, n_group


@njit(cache=True, inline="always")  # (see _scan_attribute)
def _scan_span(
    buf: np.ndarray,
    start: int,
    end: int,
    keys: np.ndarray,
    key_offsets: np.ndarray,
    by_length: np.ndarray,
    lifted_kinds: np.ndarray,
    n_keys: int,
    spans: np.ndarray,
    attrs: np.ndarray,
    events: np.ndarray,
    row: int,
    first_attr: int,
    first_event: int,
    others: np.ndarray,
) -> tuple[int, int, int]:
    """Record one span (and its attributes and events); returns (status, attributes, events).
    ``others`` is scratch for the span's attributes that are not lifted (to find repeated keys)."""
    n_attr = n_event = 0
    trace = span = parent = name = status_msg = -1
    trace_len = span_len = parent_len = name_len = status_msg_len = 0
    kind = t_start = t_end = status_code = 0
    fill = row < spans.shape[0]
    n_other = 0
    if fill:
        for k in range(n_keys):
            spans[row, S_LIFTED + L_WIDTH * k + L_LEN] = -1
    pos = start
    while pos < end:
        number, wire, value, vstart, pos = _field(buf, pos, end)
        if pos < 0:
            return GENERAL, 0, 0
        if number == 9:  # attribute
            if wire != 2:
                return GENERAL, 0, 0
            a = first_attr + n_attr
            status, key, key_len, vtype, val, val_len, num = _scan_attribute(buf, vstart, pos)
            if status != OK:
                return GENERAL, 0, 0
            if fill and a < attrs.shape[0]:
                slot = -1  # the lifted slot of this key, found by length then bytes
                if key_len < len(by_length) and by_length[key_len] != -1:
                    first, last = by_length[key_len], by_length[key_len] + 1
                    if first == -2:
                        first, last = 0, n_keys
                    for candidate in range(first, last):
                        at = key_offsets[candidate]
                        if key_offsets[candidate + 1] - at == key_len and _same_bytes(
                            buf, key, keys, at, key_len
                        ):
                            slot = candidate
                            break
                if slot >= 0:
                    expected = lifted_kinds[slot]
                    if expected >= V_BYTES:  # a token slot: packed bytes or an array of numbers
                        if vtype == V_ARRAY:
                            num = _token_array(buf, val, val + val_len, expected >= FLOAT_TOKENS)
                            if num < 0:
                                return GENERAL, 0, 0
                        elif vtype != V_BYTES or val_len % 4:
                            return GENERAL, 0, 0
                    elif vtype != expected and not (expected == V_DOUBLE and vtype == V_INT):
                        return GENERAL, 0, 0
                    lifted = S_LIFTED + L_WIDTH * slot
                    spans[row, lifted + L_VAL] = val
                    spans[row, lifted + L_LEN] = val_len
                    spans[row, lifted + L_NUM] = num
                    spans[row, lifted + L_VTYPE] = vtype
                else:  # a repeated key among the other attributes: the reference path decides
                    for b in range(n_other):
                        other = others[b]
                        if attrs[other, A_KEY_LEN] == key_len and _same_bytes(
                            buf, attrs[other, A_KEY], buf, key, key_len
                        ):
                            return GENERAL, 0, 0
                    if n_other == len(others):
                        return GENERAL, 0, 0
                    others[n_other] = a
                    n_other += 1
                attrs[a, A_OFF] = vstart
                attrs[a, A_LEN] = pos - vstart
                attrs[a, A_KEY] = key
                attrs[a, A_KEY_LEN] = key_len
                attrs[a, A_SLOT] = slot
                attrs[a, A_VTYPE] = vtype
                attrs[a, A_NUM] = num
            n_attr += 1
        elif number == 11:  # event
            if wire != 2 or value < 9 or buf[vstart] != 0x09:
                return GENERAL, 0, 0
            e = first_event + n_event
            if e < events.shape[0]:
                events[e, E_OFF] = vstart
                events[e, E_LEN] = value
                events[e, E_TIME] = _fixed(buf, vstart + 1, 8)
                if events[e, E_TIME] < 0:
                    return GENERAL, 0, 0
            n_event += 1
        elif number == 13:  # link
            return GENERAL, 0, 0
        elif 1 <= number <= 5:
            if wire != 2:
                return GENERAL, 0, 0
            if number == 1:
                trace, trace_len = vstart, value
            elif number == 2:
                span, span_len = vstart, value
            elif number == 3 and not _ascii(buf, vstart, pos):  # trace_state
                return GENERAL, 0, 0
            elif number == 4:
                parent, parent_len = vstart, value
            else:
                name, name_len = vstart, value
        elif number == 6:
            if wire != 0:
                return GENERAL, 0, 0
            kind = _int32(value)
        elif number == 7 or number == 8:
            if wire != 1 or value < 0:
                return GENERAL, 0, 0
            if number == 7:
                t_start = value
            else:
                t_end = value
        elif number == 15:  # status: message = 2, code = 3
            if wire != 2:
                return GENERAL, 0, 0
            s = vstart
            while s < pos:
                sub, sub_wire, sub_value, sub_start, s = _field(buf, s, pos)
                if s < 0:
                    return GENERAL, 0, 0
                if sub == 2:
                    if sub_wire != 2:
                        return GENERAL, 0, 0
                    status_msg, status_msg_len = sub_start, sub_value
                elif sub == 3:
                    if sub_wire != 0:
                        return GENERAL, 0, 0
                    status_code = _int32(sub_value)
        elif number in (10, 12, 14):
            if wire != 0:
                return GENERAL, 0, 0
        elif number == 16 and wire != 5:
            return GENERAL, 0, 0
    if fill:
        zero = 0
        if trace_len == 16 and _all_zero(buf, trace, 16):
            zero |= 1
        if span_len == 8 and _all_zero(buf, span, 8):
            zero |= 2
        spans[row, S_TRACE] = trace
        spans[row, S_TRACE_LEN] = trace_len
        spans[row, S_SPAN] = span
        spans[row, S_SPAN_LEN] = span_len
        spans[row, S_PARENT] = parent
        spans[row, S_PARENT_LEN] = parent_len
        spans[row, S_NAME] = name
        spans[row, S_NAME_LEN] = name_len
        spans[row, S_KIND] = kind
        spans[row, S_START] = t_start
        spans[row, S_END] = t_end
        spans[row, S_STATUS_CODE] = status_code
        spans[row, S_STATUS_MSG] = status_msg
        spans[row, S_STATUS_MSG_LEN] = status_msg_len
        spans[row, S_ATTR_FIRST] = first_attr
        spans[row, S_ATTR_COUNT] = n_attr
        spans[row, S_EVENT_FIRST] = first_event
        spans[row, S_EVENT_COUNT] = n_event
        spans[row, S_ZERO_IDS] = zero
    return OK, n_attr, n_event


@njit(cache=True)
def _token_array(buf: np.ndarray, start: int, end: int, floats: bool) -> int:
    """Elements of an ``ArrayValue`` whose entries are all ``int_value`` within int32 (token ids) or all
    ``double_value`` (``floats``: logprobs), each an AnyValue of that one field; -1 for anything else
    (the reference decoder then decides)."""
    count = 0
    pos = start
    tag = 0x21 if floats else 0x18  # AnyValue field 4 (fixed64) or 3 (varint)
    while pos < end:
        if buf[pos] != 0x0A or pos + 2 >= end:  # ArrayValue.values (field 1, length-delimited)
            return -1
        length = np.int64(buf[pos + 1])
        item, item_end = pos + 2, pos + 2 + length
        if length >= 0x80 or item_end > end or buf[item] != tag:
            return -1
        if floats:
            if length != 9:
                return -1
        else:
            value, after = _varint(buf, item + 1, item_end)
            if after != item_end or value < -(1 << 31) or value >= 1 << 31:
                return -1
        pos = item_end
        count += 1
    return count


@njit(cache=True)
def pack_tokens(
    buf: np.ndarray,
    offsets: np.ndarray,
    lengths: np.ndarray,
    kinds: np.ndarray,
    out_offsets: np.ndarray,
    out: np.ndarray,
    ints: np.ndarray,
    floats: np.ndarray,
) -> None:
    """Fill one token column's packed values: ``out`` (bytes), ``ints`` (int32) and ``floats`` (float32)
    are views of the same buffer, row ``i`` at byte ``out_offsets[i]``. A row of kind V_BYTES is copied;
    a V_ARRAY row (checked by :func:`_token_array`) is decoded, into ``floats`` when it is non-empty."""
    bits = np.empty(1, np.int64)
    as_double = bits.view(np.float64)
    use_floats = len(floats) > 0
    for i in range(len(offsets)):
        if lengths[i] <= 0:
            continue
        if kinds[i] == V_BYTES:
            _copy(out, out_offsets[i], buf, offsets[i], lengths[i])
            continue
        j = out_offsets[i] // 4
        pos, end = offsets[i], offsets[i] + lengths[i]
        while pos < end:  # elements as _token_array checked them: 0x0A, length < 0x80, tag, value
            item_end = pos + 2 + np.int64(buf[pos + 1])
            if use_floats:
                bits[0] = _fixed(buf, pos + 3, 8)
                floats[j] = as_double[0]
            else:
                ints[j] = _varint(buf, pos + 3, item_end)[0]
            pos = item_end
            j += 1


@njit(cache=True)
def _ascii(buf: np.ndarray, start: int, end: int) -> bool:
    """Whether ``buf[start:end]`` is ASCII (so valid UTF-8 without a full check)."""
    for i in range(start, end):  # noqa: SIM110 (numba compiles loops, not generator expressions)
        if buf[i] >= 0x80:
            return False
    return True


@njit(cache=True)
def _all_zero(buf: np.ndarray, off: int, length: int) -> bool:
    for i in range(length):  # noqa: SIM110 (numba compiles loops, not generator expressions)
        if buf[off + i]:
            return False
    return True


# --- byte intrinsics -----------------------------------------------------------------------------------
@intrinsic
def _copy(typingctx, dst, dst_start, src, src_start, count):
    """``dst[dst_start : dst_start + count] = src[src_start : ...]`` as one memcpy (numba's slice
    assignment copies byte by byte, ~10x slower); both arrays are uint8."""

    def codegen(context, builder, signature, args):
        target = context.make_array(signature.args[0])(context, builder, args[0])
        source = context.make_array(signature.args[2])(context, builder, args[2])
        to = builder.gep(target.data, [args[1]])
        cgutils.raw_memcpy(builder, to, builder.gep(source.data, [args[3]]), args[4], 1)
        return context.get_dummy_value()

    return types.none(dst, dst_start, src, src_start, count), codegen


@intrinsic
def _same_bytes(typingctx, a, a_start, b, b_start, count):
    """``a[a_start : a_start + count] == b[b_start : ...]`` as one ``memcmp`` (a byte loop costs ~3x
    more; matching attribute keys is a good part of the scan); both arrays are uint8."""

    def codegen(context, builder, signature, args):
        first = context.make_array(signature.args[0])(context, builder, args[0])
        second = context.make_array(signature.args[2])(context, builder, args[2])
        byte_pointer = ir.IntType(8).as_pointer()
        memcmp_type = ir.FunctionType(ir.IntType(32), [byte_pointer, byte_pointer, ir.IntType(64)])
        memcmp = cgutils.get_or_insert_function(builder.module, memcmp_type, "memcmp")
        pointers = [builder.gep(first.data, [args[1]]), builder.gep(second.data, [args[3]])]
        result = builder.call(memcmp, [*pointers, args[4]])
        return builder.icmp_signed("==", result, ir.Constant(ir.IntType(32), 0))

    return types.boolean(a, a_start, b, b_start, count), codegen


# --- building Arrow buffers --------------------------------------------------------------------------
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


@njit(cache=True)
def _allocate(sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int32 offsets for rows of ``sizes`` bytes, and an uninitialised buffer holding them all."""
    offsets = np.empty(len(sizes) + 1, np.int32)
    total = 0
    for i in range(len(sizes)):
        offsets[i] = total
        total += sizes[i]
    offsets[len(sizes)] = total
    return offsets, np.empty(total, np.uint8)


@njit(cache=True)
def gather_columns(
    buf: np.ndarray, offsets: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Concatenate ``buf[offsets[c, i] : offsets[c, i] + lengths[c, i]]`` for each column ``c`` (a row
    of ``offsets``/``lengths``, columns x rows); a negative length stands for a missing value and
    contributes nothing. Returns (data, each column's int32 offsets from 0 (columns x rows + 1), where
    each column's bytes start in data (columns + 1)), so every column can own its own slice of data.
    """
    n_columns, n = offsets.shape
    out_offsets = np.empty((n_columns, n + 1), np.int32)
    starts = np.empty(n_columns + 1, np.int64)
    total = 0
    for c in range(n_columns):
        starts[c] = total
        size = 0
        for i in range(n):
            out_offsets[c, i] = size
            size += max(lengths[c, i], 0)
        out_offsets[c, n] = size
        total += size
    starts[n_columns] = total
    data = np.empty(total, np.uint8)
    for c in range(n_columns):
        for i in range(n):
            if lengths[c, i] > 0:
                _copy(data, starts[c] + out_offsets[c, i], buf, offsets[c, i], lengths[c, i])
    return data, out_offsets, starts


@njit(cache=True)
def hex_gather(
    buf: np.ndarray, offsets: np.ndarray, present: np.ndarray, width: int
) -> tuple[np.ndarray, np.ndarray]:
    """Lowercase hex of ``width``-byte ids at ``offsets`` (rows not ``present`` are empty)."""
    out_offsets, data = _allocate(present.astype(np.int64) * (2 * width))
    for i in range(len(offsets)):
        if present[i]:
            o = out_offsets[i]
            src = offsets[i]
            for j in range(width):
                byte = buf[src + j]
                data[o + 2 * j] = _HEX[byte >> 4]
                data[o + 2 * j + 1] = _HEX[byte & 15]
    return data, out_offsets


@njit(cache=True)
def join_fragments(
    first: np.ndarray,
    count: np.ndarray,
    item_fragment: np.ndarray,
    fragments: np.ndarray,
    fragment_offsets: np.ndarray,
    numeric: np.ndarray,
    numbers: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per row ``{f1,f2,...}``: the fragments of items ``first[i] ..< first[i] + count[i]``.

    ``item_fragment[j]`` is the fragment of item ``j``, or -1 to leave the item out; if ``numeric[j]``
    the decimal digits of ``numbers[j]`` follow it.
    """
    n = len(first)
    sizes = np.full(n, 1, np.int64)  # the braces and the commas: 1 + one per fragment, at least 2
    for i in range(n):
        for j in range(first[i], first[i] + count[i]):
            f = item_fragment[j]
            if f >= 0:
                sizes[i] += fragment_offsets[f + 1] - fragment_offsets[f] + 1
                if numeric[j]:
                    sizes[i] += _decimal_width(numbers[j])
    out_offsets, data = _allocate(np.maximum(sizes, 2))
    for i in range(n):
        o = out_offsets[i]
        data[o] = 0x7B  # {
        o += 1
        wrote = False
        for j in range(first[i], first[i] + count[i]):
            f = item_fragment[j]
            if f >= 0:
                if wrote:
                    data[o] = 0x2C  # ,
                    o += 1
                size = fragment_offsets[f + 1] - fragment_offsets[f]
                _copy(data, o, fragments, fragment_offsets[f], size)
                o += size
                if numeric[j]:
                    o = _put_decimal(data, o, numbers[j])
                wrote = True
        data[o] = 0x7D  # }
    return data, out_offsets


@njit(cache=True)
def _magnitude(value: int) -> np.uint64:
    """``abs(value)`` as uint64 (exact for the smallest int64 too)."""
    return np.uint64(value) if value >= 0 else np.uint64(-(value + 1)) + np.uint64(1)


@njit(cache=True)
def _decimal_width(value: int) -> int:
    """Characters of ``value`` in decimal, its sign included."""
    rest = _magnitude(value)
    width = 1 if value >= 0 else 2
    while rest >= np.uint64(10):
        rest //= np.uint64(10)
        width += 1
    return width


@njit(cache=True)
def _put_decimal(data: np.ndarray, o: int, value: int) -> int:
    """Write ``value`` in decimal at ``data[o]``; returns the position after it."""
    end = o + _decimal_width(value)
    if value < 0:
        data[o] = 0x2D  # -
    rest = _magnitude(value)
    at = end - 1
    while True:  # digits from the last
        data[at] = 0x30 + np.uint8(rest % np.uint64(10))
        rest //= np.uint64(10)
        at -= 1
        if rest == np.uint64(0):
            return end


@njit(cache=True)
def join_events(
    first: np.ndarray,
    count: np.ndarray,
    event_template: np.ndarray,
    event_time: np.ndarray,
    heads: np.ndarray,
    head_offsets: np.ndarray,
    tails: np.ndarray,
    tail_offsets: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per row ``[e1,e2,...]`` where event ``j`` is ``head + decimal(time) + tail`` of its template."""
    n = len(first)
    sizes = np.empty(n, np.int64)
    for i in range(n):
        sizes[i] = 2 + max(count[i] - 1, 0)  # the brackets and the commas
        for j in range(first[i], first[i] + count[i]):
            t = event_template[j]
            sizes[i] += head_offsets[t + 1] - head_offsets[t] + tail_offsets[t + 1] - tail_offsets[t]
            sizes[i] += _decimal_width(event_time[j])
    out_offsets, data = _allocate(sizes)
    for i in range(n):
        o = out_offsets[i]
        data[o] = 0x5B  # [
        o += 1
        for j in range(first[i], first[i] + count[i]):
            if j > first[i]:
                data[o] = 0x2C
                o += 1
            t = event_template[j]
            size = head_offsets[t + 1] - head_offsets[t]
            _copy(data, o, heads, head_offsets[t], size)
            o += size
            o = _put_decimal(data, o, event_time[j])
            size = tail_offsets[t + 1] - tail_offsets[t]
            _copy(data, o, tails, tail_offsets[t], size)
            o += size
        data[o] = 0x5D  # ]
    return data, out_offsets
