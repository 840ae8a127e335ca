"""Unsigned LEB128 varints, as protobuf and Thrift's compact protocol write them."""

from __future__ import annotations

MAX_BYTES = 10  # enough for 64 bits


def read_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """(value, next position) of the varint at ``pos``; the next position is past the end of ``data``
    when the varint is truncated or longer than :data:`MAX_BYTES`."""
    value = shift = 0
    end = min(len(data), pos + MAX_BYTES)
    while pos < end:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    return 0, len(data) + 1
