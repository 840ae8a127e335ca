"""Packing token ids and logprobs into span attributes, and back.

Token ids travel as little-endian int32 bytes and logprobs as little-endian float32 bytes
(``semconv.ENCODING_PACKED``): about 20x cheaper to create and encode than OTel int/float arrays.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

IDS_DTYPE = np.dtype("<i4")
LOGPROBS_DTYPE = np.dtype("<f4")


def pack_ids(ids: Sequence[int] | np.ndarray) -> bytes:
    return np.asarray(ids, dtype=IDS_DTYPE).tobytes()


def pack_logprobs(logprobs: Sequence[float] | np.ndarray) -> bytes:
    return np.asarray(logprobs, dtype=LOGPROBS_DTYPE).tobytes()


def unpack_ids(data: bytes) -> np.ndarray:
    if len(data) % 4:
        raise ValueError(f"packed token ids must be a multiple of 4 bytes, got {len(data)}")
    return np.frombuffer(data, dtype=IDS_DTYPE)


def unpack_logprobs(data: bytes) -> np.ndarray:
    if len(data) % 4:
        raise ValueError(f"packed logprobs must be a multiple of 4 bytes, got {len(data)}")
    return np.frombuffer(data, dtype=LOGPROBS_DTYPE)
