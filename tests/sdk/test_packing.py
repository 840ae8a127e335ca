"""The SDK's numpy-free packing equals numpy's little-endian int32 / float32 bytes, the form the collector
and the builder unpack (spanstore.encoding)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from tinkertrace.packing import pack_ids, pack_logprobs
from tinkertrace.spanstore.encoding import lists_from_packed

INT32 = st.integers(-(2**31), 2**31 - 1)
FLOATS = st.floats(allow_nan=False, width=64, min_value=-1e30, max_value=0.0)


@given(st.lists(INT32, max_size=300))
def test_ids_pack_like_numpy_and_unpack_to_the_same_list(ids: list[int]) -> None:
    packed = pack_ids(ids)
    assert packed == np.asarray(ids, dtype="<i4").tobytes() == pack_ids(np.asarray(ids, dtype=np.int64))
    unpacked = lists_from_packed(pa.array([packed], pa.binary()), pa.list_(pa.int32()))
    assert unpacked.to_pylist() == [ids]


@given(st.lists(FLOATS, max_size=300))
def test_logprobs_pack_like_numpy(logprobs: list[float]) -> None:
    expected = np.asarray(logprobs, dtype="<f4").tobytes()
    assert pack_logprobs(logprobs) == expected == pack_logprobs(np.asarray(logprobs))
