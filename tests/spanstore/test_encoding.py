"""``spanstore.encoding``: list columns as packed ``large_binary`` values and back, at offsets past int32."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tinkertrace.spanstore.encoding import lists_as_binary, lists_from_packed
from tinkertrace.spanstore.writer import take_rows

PAST_INT32 = 2**31 + 8  # values: more than a list's int32 offsets can count


def _zeros_int8(n: int) -> pa.Array:
    """``n`` int8 zeros, zero-copy over ``np.zeros`` (pages untouched until read: costs no memory)."""
    return pa.Array.from_buffers(pa.int8(), n, [None, pa.py_buffer(np.zeros(n, np.int8))])


def test_large_list_offsets_past_int32_are_read_as_int64() -> None:
    """A ``large_list``'s int64 offsets read as int32 came out as their halves: negative once past 2**31
    (``ArrowInvalid: Negative offsets in binary array``), wrong below it."""
    offsets = pa.array([0, 4, 2**31 + 4, 2**31 + 6, PAST_INT32], pa.int64())
    column = pa.chunked_array([pa.LargeListArray.from_arrays(offsets, _zeros_int8(PAST_INT32))])
    packed = lists_as_binary(column)
    assert packed is not None and packed.type == pa.large_binary()
    packed.validate(full=True)
    assert np.frombuffer(packed.buffers()[1], np.int64).tolist() == offsets.to_pylist()
    assert packed.buffers()[2].address == column.chunk(0).values.buffers()[1].address  # zero-copy
    assert packed.slice(3).to_pylist() == [b"\0\0"]


@pytest.mark.slow
def test_chunks_past_int32_values_in_all_are_packed() -> None:
    """Two ``list`` chunks of 2**30 + 4 values each: combining them as a list overflowed its int32
    offsets; packed chunk by chunk they concatenate as ``large_binary`` (int64 offsets). Copies 2 GiB
    (~5 s)."""
    half = PAST_INT32 // 2
    chunk = pa.ListArray.from_arrays(pa.array([0, 3, half], pa.int32()), _zeros_int8(half))
    packed = lists_as_binary(pa.chunked_array([chunk, chunk]))
    assert packed is not None and len(packed) == 4
    packed.validate()
    assert np.frombuffer(packed.buffers()[1], np.int64).tolist() == [0, 3, half, half + 3, PAST_INT32]


def test_lists_from_packed_refuses_to_wrap_int32_offsets() -> None:
    """Packed values past int32 as a ``list``: an error naming the overflow, not wrapped (negative)
    offsets; as a ``large_list`` they fit."""
    data = pa.py_buffer(np.zeros(PAST_INT32, np.int8))
    offsets = pa.py_buffer(np.array([0, 8, PAST_INT32], np.int64))
    packed = pa.Array.from_buffers(pa.large_binary(), 2, [None, offsets, data])
    with pytest.raises(pa.ArrowInvalid, match="int32 offsets"):
        lists_from_packed(packed, pa.list_(pa.int8()))
    lists = lists_from_packed(packed, pa.large_list(pa.int8()))
    lists.validate()
    assert lists.value_lengths().to_pylist() == [8, PAST_INT32 - 8]


def _lists(rng: np.random.Generator, rows: int, list_type: pa.DataType) -> pa.Array:
    lengths = rng.integers(0, 6, rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    child = pa.array(rng.integers(0, 1000, int(offsets[-1]) + 5, dtype=np.int32)).slice(5)  # own offset
    if pa.types.is_large_list(list_type):
        return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), child)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), child)


@pytest.mark.parametrize("list_type", [pa.list_(pa.int32()), pa.large_list(pa.int32())])
def test_take_rows_over_sliced_chunks_matches_arrows_take(list_type: pa.DataType) -> None:
    """Sliced chunks (their own offsets) of lists whose values have their own offset, nulls among them."""
    rng = np.random.default_rng(3)
    lists = _lists(rng, 40, list_type)
    with_nulls = pa.array([*lists.to_pylist()[:10], None, *lists.to_pylist()[10:]], list_type)
    column = pa.chunked_array([lists.slice(2, 17), with_nulls.slice(5, 20), lists.slice(30)], list_type)
    table = pa.table({"ids": column, "n": pa.array(np.arange(len(column)))})
    indices = pa.array(rng.permutation(len(column)))
    packed = lists_as_binary(column)
    assert packed is not None
    assert lists_from_packed(packed, list_type).to_pylist() == column.to_pylist()
    assert take_rows(table, indices).equals(table.take(indices))
