"""Packed token ids and logprobs (``tinkertrace.packing``) as Arrow list columns, and back.

Token ids travel as little-endian int32 bytes and logprobs as little-endian float32 bytes
(``semconv.ENCODING_PACKED``); turning many of them into a ``list<int32>`` column is one vectorised step.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def lists_from_packed(packed: pa.Array, list_type: pa.DataType) -> pa.Array:
    """A list array whose rows are the rows of a binary / large_binary array of packed values.

    Each binary value holds one list's fixed-width values in machine byte order (little-endian here);
    the values buffer is shared, not copied. Null binary values become null lists.
    """
    width = list_type.value_type.bit_width // 8
    offset_type = np.int64 if pa.types.is_large_binary(packed.type) else np.int32
    byte_offsets = np.frombuffer(packed.buffers()[1], offset_type, packed.offset + len(packed) + 1)
    start = int(byte_offsets[packed.offset])
    offsets = (byte_offsets[packed.offset :] - start) // width
    if pa.types.is_large_list(list_type):
        offsets = offsets.astype(np.int64)
    elif len(offsets) and offsets[-1] > np.iinfo(np.int32).max:  # astype would wrap to negative offsets
        raise pa.ArrowInvalid(f"{offsets[-1]} values do not fit a {list_type}'s int32 offsets")
    else:
        offsets = offsets.astype(np.int32)
    data = packed.buffers()[2]
    data = data.slice(start) if data is not None else pa.py_buffer(b"")
    values = pa.Array.from_buffers(list_type.value_type, int(offsets[-1]), [None, data])
    validity = packed.buffers()[0]
    if validity is not None and packed.offset:
        validity = pc.is_valid(packed).buffers()[1]
    return pa.Array.from_buffers(
        list_type, len(packed), [validity, pa.py_buffer(offsets)], packed.null_count, children=[values]
    )


def lists_as_binary(column: pa.ChunkedArray) -> pa.Array | None:
    """Each list's values as one ``large_binary`` value, sharing the values buffer (the inverse of
    :func:`lists_from_packed`); ``None`` if the values are not all valid and fixed-width.

    ``list`` (int32 offsets) and ``large_list`` (int64 offsets) columns; other types give ``None``.
    A column of several chunks is packed chunk by chunk and the ``large_binary`` chunks concatenated
    (int64 byte offsets): combining the list chunks first would overflow a ``list``'s int32 offsets
    once the chunks hold more than 2**31 - 1 values in all.
    """
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
        return None
    value_type = column.type.value_type
    if not pa.types.is_primitive(value_type) or pa.types.is_boolean(value_type):
        return None
    if column.num_chunks == 1:
        return _list_as_binary(column.chunk(0))
    chunks = [_list_as_binary(chunk) for chunk in column.chunks]
    if any(chunk is None for chunk in chunks):
        return None
    return pa.concat_arrays(chunks) if chunks else pa.array([], pa.large_binary())


def _list_as_binary(array: pa.Array) -> pa.Array | None:
    """One ``list`` / ``large_list`` array of fixed-width values as ``large_binary``, zero-copy."""
    if len(array) == 0:
        return pa.array([], pa.large_binary())
    values = array.values
    if values.null_count:
        return None
    width = array.type.value_type.bit_width // 8
    offset_type = np.int64 if pa.types.is_large_list(array.type) else np.int32
    offsets = np.frombuffer(array.buffers()[1], offset_type, array.offset + len(array) + 1)
    byte_offsets = (offsets.astype(np.int64) + values.offset) * width
    return pa.Array.from_buffers(
        pa.large_binary(),
        len(array),
        [array.buffers()[0], pa.py_buffer(byte_offsets), values.buffers()[1]],
        array.null_count,
        array.offset,
    )
