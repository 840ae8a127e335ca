"""Packing token ids and logprobs into span attribute values (numpy-free: the SDK's core needs it).

Token ids travel as little-endian int32 bytes and logprobs as little-endian float32 bytes
(``semconv.ENCODING_PACKED``): about 20x cheaper to create and encode than OTel int/float arrays.
The collector and the builder turn them back into Arrow lists (``spanstore.encoding``).
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable
from typing import Any


def _pack(values: Iterable[Any], code: str, dtype: str) -> bytes:
    if hasattr(values, "astype"):  # a numpy array: convert without a Python loop
        return values.astype(dtype).tobytes()
    packed = array(code, values)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def pack_ids(ids: Iterable[int]) -> bytes:
    """Token ids as little-endian int32 bytes."""
    return _pack(ids, "i", "<i4")


def pack_logprobs(logprobs: Iterable[float]) -> bytes:
    """Logprobs as little-endian float32 bytes."""
    return _pack(logprobs, "f", "<f4")
