"""Arrow arrays wrapped around the buffers the compiled kernels fill: no per-row Python, no copy
where a wrap will do (strings are validated as UTF-8; hex ids are ASCII by construction)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tinkertrace.spanstore.convert import compiled_kernels as k

TIMESTAMP = pa.timestamp("ns", tz="UTC")


def strings(data: np.ndarray, offsets: np.ndarray, present: np.ndarray | None = None) -> pa.Array:
    """A validated (UTF-8) string array from kernel output; rows not ``present`` are null."""
    bitmap = validity_bitmap(present)
    array = pa.StringArray.from_buffers(len(offsets) - 1, pa.py_buffer(offsets), pa.py_buffer(data), bitmap)
    array.validate(full=True)
    return array


def validity_bitmap(present: np.ndarray | None) -> pa.Buffer | None:
    """The Arrow validity bitmap of ``present`` (``None`` when every row is present)."""
    if present is None or present.all():
        return None
    return pa.py_buffer(np.packbits(present, bitorder="little"))


def timestamps(nanoseconds: np.ndarray) -> pa.Array:
    """UTC nanosecond timestamps (a buffer wrap: a cast is an Arrow compute call, ~20 µs each)."""
    return pa.Array.from_buffers(
        TIMESTAMP, len(nanoseconds), [None, pa.py_buffer(np.ascontiguousarray(nanoseconds))]
    )


def constant_strings(value: bytes, n: int) -> pa.Array:
    offsets = np.arange(n + 1, dtype=np.int32) * len(value)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(value * n))


def hex_ids(buf: np.ndarray, offsets: np.ndarray, present: np.ndarray, width: int) -> pa.Array:
    """Lowercase hex of ``width``-byte ids (ASCII by construction: no UTF-8 check); rows not ``present``
    are null."""
    data, out_offsets = k.hex_gather(buf, offsets, present, width)
    return pa.StringArray.from_buffers(
        len(out_offsets) - 1, pa.py_buffer(out_offsets), pa.py_buffer(data), validity_bitmap(present)
    )
