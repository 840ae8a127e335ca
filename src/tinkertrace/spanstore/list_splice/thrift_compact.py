"""Thrift compact protocol, generic: decode a struct into field values and encode it back.

Parquet's footer (``FileMetaData``) and page headers are Thrift structs in the compact protocol.
``splice`` reads the footer Arrow wrote, replaces a few column chunks' metadata and writes it
back, so this codec keeps every field it does not know about: a struct decodes to
``{field id: (type, value)}`` in wire order and encodes back to the same bytes.

Values by type: ``BOOL`` → bool, ``BYTE``/``I16``/``I32``/``I64`` → int, ``DOUBLE`` → float,
``BINARY`` → bytes, ``LIST``/``SET`` → ``(element type, [values])``, ``MAP`` →
``(key type, value type, [(key, value)])``, ``STRUCT`` → ``{field id: (type, value)}``.
"""

from __future__ import annotations

import struct
from typing import Any

# compact protocol type codes (BOOL is written as TRUE/FALSE in a field header)
BOOL, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = 1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12
_BOOL_FALSE = 2

Struct = dict[int, tuple[int, Any]]


class ThriftError(ValueError):
    """Bytes that are not a well-formed compact-protocol struct."""


def decode_struct(data: bytes | memoryview, pos: int = 0) -> tuple[Struct, int]:
    """The struct at ``pos`` and the position after it."""
    reader = _Reader(memoryview(data).cast("B"), pos)
    value = reader.struct()
    return value, reader.pos


def encode_struct(value: Struct) -> bytes:
    out = bytearray()
    _write_struct(out, value)
    return bytes(out)


class _Reader:
    def __init__(self, data: memoryview, pos: int) -> None:
        self.data = data
        self.pos = pos

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise ThriftError("truncated Thrift data")
        value = self.data[self.pos]
        self.pos += 1
        return value

    def varint(self) -> int:
        """An unsigned LEB128 varint (at most 10 bytes: 64 bits)."""
        value = shift = 0
        for pos in range(self.pos, min(len(self.data), self.pos + 10)):
            byte = self.data[pos]
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                self.pos = pos + 1
                return value
            shift += 7
        raise ThriftError("truncated or overlong varint in Thrift data")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def raw(self, size: int) -> bytes:
        if size < 0 or self.pos + size > len(self.data):
            raise ThriftError("truncated Thrift data")
        value = bytes(self.data[self.pos : self.pos + size])
        self.pos += size
        return value

    def value(self, ttype: int) -> Any:
        if ttype in (BOOL, _BOOL_FALSE):  # a bool in a list or map: one byte
            return self.byte() == BOOL
        if ttype == BYTE:
            return self.byte()
        if ttype in (I16, I32, I64):
            return self.zigzag()
        if ttype == DOUBLE:
            return struct.unpack("<d", self.raw(8))[0]
        if ttype == BINARY:
            return self.raw(self.varint())
        if ttype in (LIST, SET):
            header = self.byte()
            size, element = header >> 4, header & 0x0F
            if size == 15:
                size = self.varint()
            return element, [self.value(element) for _ in range(size)]
        if ttype == MAP:
            size = self.varint()
            types = self.byte() if size else 0
            key, val = types >> 4, types & 0x0F
            return key, val, [(self.value(key), self.value(val)) for _ in range(size)]
        if ttype == STRUCT:
            return self.struct()
        raise ThriftError(f"unknown Thrift type {ttype}")

    def struct(self) -> Struct:
        fields: Struct = {}
        last = 0
        while True:
            header = self.byte()
            if header == 0:
                return fields
            delta, ttype = header >> 4, header & 0x0F
            field_id = last + delta if delta else self.zigzag()
            if ttype in (BOOL, _BOOL_FALSE):
                fields[field_id] = (BOOL, ttype == BOOL)
            else:
                fields[field_id] = (ttype, self.value(ttype))
            last = field_id


def _varint(out: bytearray, n: int) -> None:
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _zigzag(out: bytearray, n: int) -> None:
    _varint(out, (n << 1) ^ (n >> 63))


def _write_value(out: bytearray, ttype: int, value: Any) -> None:
    if ttype == BOOL:
        out.append(BOOL if value else _BOOL_FALSE)
    elif ttype == BYTE:
        out.append(value & 0xFF)
    elif ttype in (I16, I32, I64):
        _zigzag(out, value)
    elif ttype == DOUBLE:
        out += struct.pack("<d", value)
    elif ttype == BINARY:
        _varint(out, len(value))
        out += value
    elif ttype in (LIST, SET):
        element, items = value
        if len(items) < 15:
            out.append(len(items) << 4 | element)
        else:
            out.append(0xF0 | element)
            _varint(out, len(items))
        for item in items:
            _write_value(out, element, item)
    elif ttype == MAP:
        key, val, items = value
        _varint(out, len(items))
        if items:
            out.append(key << 4 | val)
        for k, v in items:
            _write_value(out, key, k)
            _write_value(out, val, v)
    elif ttype == STRUCT:
        _write_struct(out, value)
    else:
        raise ThriftError(f"unknown Thrift type {ttype}")


def _write_struct(out: bytearray, fields: Struct) -> None:
    last = 0
    for field_id, (ttype, value) in fields.items():
        wire_type = (BOOL if value else _BOOL_FALSE) if ttype == BOOL else ttype
        if 0 < field_id - last <= 15:
            out.append((field_id - last) << 4 | wire_type)
        else:
            out.append(wire_type)
            _zigzag(out, field_id)
        if ttype != BOOL:
            _write_value(out, ttype, value)
        last = field_id
    out.append(0)
