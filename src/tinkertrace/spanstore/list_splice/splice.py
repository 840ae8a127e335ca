"""Parquet column chunks of list columns, written from the lists' packed values in O(rows) work.

The collector's fast path for writing files (``writer.write_parquet_atomic(splice_lists=True)``); every
other writer uses ``pyarrow.parquet`` alone, and both write the same tables.

Arrow's Parquet writer builds, encodes and counts a repetition and a definition level for every list
value (~12 ns each, 6 of the ~10 µs a span costs to write: a span has ~500 token values). But a list
of non-null fixed-width values needs no per-value level work: its levels are one run of
repetition 0, one run of repetition 1 and one run of definition "present" per row. This module
writes such columns itself:

1. Arrow writes the file with those columns all null (one level a row: nearly free), so the schema,
   the other columns, their statistics and the ``ARROW:schema`` metadata are Arrow's own.
2. :func:`splice` appends, per row group, a column chunk of each list column: data pages v1 of
   run-length-encoded levels (computed per row with numpy) and the values, PLAIN or
   BYTE_STREAM_SPLIT, compressed with the file's zstd level. The rows may be written in another
   order than they are stored (``PackedList.order``, the sort of the file): each page's values are
   gathered in that order and split in one pass (``gather_kernel``), never sorted as a whole.
3. It rewrites the footer (Thrift, see ``thrift_compact``) so those columns point at the new chunks;
   the null chunks stay behind as a few unused bytes.

Readers see an ordinary file (tests/spanstore/test_list_splice.py reads every shape back with
Arrow and DuckDB, and compares it with the file ``pyarrow.parquet`` writes).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tinkertrace.spanstore.encoding import lists_as_binary
from tinkertrace.spanstore.list_splice import thrift_compact as tc

# Thrift field ids (parquet.thrift) of the footer parts rewritten here
_FILE_ROW_GROUPS = 4  # FileMetaData.row_groups
_GROUP_COLUMNS, _GROUP_BYTES, _GROUP_ROWS, _GROUP_COMPRESSED = 1, 2, 3, 6  # RowGroup
_CHUNK_META = 3  # ColumnChunk.meta_data; 4-7 locate a page index
_PAGE_INDEX_FIELDS = (4, 5, 6, 7)
(
    _META_ENCODINGS,
    _META_PATH,
    _META_CODEC,
    _META_VALUES,
    _META_UNCOMPRESSED,
    _META_COMPRESSED,
) = (2, 3, 4, 5, 6, 7)  # ColumnMetaData
_META_DATA_PAGE, _META_ENCODING_STATS = 9, 13
_META_NULL_CHUNK_ONLY = (11, 12, 16)  # dictionary page offset, statistics, size statistics
# Parquet enum values (parquet.thrift)
_DATA_PAGE = 0
_PLAIN, _RLE, _BYTE_STREAM_SPLIT = 0, 3, 9
_ZSTD = 6
# values per data page: Arrow's default page size (1 MiB)
PAGE_BYTES = 1024 * 1024
_MAGIC = b"PAR1"
_FOOTER_TAIL = 8  # footer length (u32) + magic


@dataclass(frozen=True)
class PackedList:
    """A list column as its packed values: ``packed`` holds each row's values as one ``large_binary``
    value of its little-endian items (a null: a null list); the values are never null."""

    packed: pa.Array
    list_type: pa.DataType
    definition: tuple[int, int]  # the definition levels of an empty list and of a value
    byte_stream_split: bool
    order: np.ndarray | None = None  # the rows of ``packed`` to write, in this order (None: as stored)

    @classmethod
    def of(
        cls, field: pa.Field, packed: pa.Array, byte_stream_split: bool, order: np.ndarray | None = None
    ) -> PackedList:
        """The column ``field`` (a list type) holding ``packed``, written in ``order``."""
        empty = int(field.nullable)
        value = empty + 1 + int(field.type.value_field.nullable)
        return cls(packed, field.type, (empty, value), byte_stream_split, order)

    def rows(self, first: int, count: int) -> np.ndarray:
        """Indices into ``packed`` of the written rows ``first ..< first + count``."""
        if self.order is None:
            return np.arange(first, first + count)
        return self.order[first : first + count]


@dataclass(frozen=True)
class _Page:
    header: bytes
    body: pa.Buffer  # compressed
    uncompressed_size: int  # header included, as Parquet counts it
    levels: int


def packed_lists(
    table: pa.Table, names: Iterable[str], byte_stream_split: Collection[str], order: np.ndarray | None = None
) -> dict[str, PackedList]:
    """The columns ``names`` of ``table`` that can be written here (lists of non-null fixed-width
    values), packed, to be written in ``order``; BYTE_STREAM_SPLIT for those in ``byte_stream_split``."""
    lists = {}
    for name in names:
        if name not in table.column_names:
            continue
        packed = lists_as_binary(table.column(name))
        if packed is not None and writable(packed):
            lists[name] = PackedList.of(table.schema.field(name), packed, name in byte_stream_split, order)
    return lists


def writable(packed: pa.Array) -> bool:
    """Whether ``packed`` can be written here: no null list covers values (Arrow allows it)."""
    if packed.null_count == 0:
        return True
    return not np.diff(_byte_offsets(packed))[~_is_valid(packed)].any()


def parquet_pieces(
    table: pa.Table, lists: Mapping[str, PackedList], compression_level: int, **arrow_options: Any
) -> list:
    """A zstd Parquet file of ``table`` as pieces to write in order: Arrow (``pq.write_table`` with
    ``arrow_options``) writes the columns named in ``lists`` as nulls, then :func:`splice` replaces
    them with chunks of their packed values."""
    table = as_nulls(table, lists)
    arrow_file = pa.BufferOutputStream()
    pq.write_table(
        table, arrow_file, compression="zstd", compression_level=compression_level, **arrow_options
    )
    return splice(arrow_file.getvalue(), lists, compression_level)


def as_nulls(table: pa.Table, names: Iterable[str]) -> pa.Table:
    """``table`` with the columns ``names`` all null (what Arrow writes of the lists written here)."""
    for name in names:
        index = table.schema.get_field_index(name)
        field = table.schema.field(index)
        if table.column(index).null_count != table.num_rows:
            table = table.set_column(index, field, pa.nulls(table.num_rows, field.type))
    return table


def splice(arrow_file: bytes | pa.Buffer, columns: Mapping[str, PackedList], compression_level: int) -> list:
    """The pieces of a Parquet file, to be written in order: ``arrow_file`` (written by Arrow, zstd, with
    ``columns`` all null) with those columns' chunks replaced by chunks of their packed values."""
    view = memoryview(arrow_file).cast("B")
    if bytes(view[:4]) != _MAGIC or bytes(view[-4:]) != _MAGIC:
        raise ValueError("not a Parquet file")
    footer_size = struct.unpack("<I", view[-_FOOTER_TAIL:-4])[0]
    footer_start = len(view) - _FOOTER_TAIL - footer_size
    metadata, _ = tc.decode_struct(view[footer_start : len(view) - _FOOTER_TAIL])
    codec = pa.Codec("zstd", compression_level=compression_level)
    pieces: list = [view[:footer_start]]
    offset = footer_start
    first_row = 0
    for row_group in metadata[_FILE_ROW_GROUPS][1][1]:
        rows = row_group[_GROUP_ROWS][1]
        for chunk in row_group[_GROUP_COLUMNS][1][1]:
            meta = chunk[_CHUNK_META][1]
            name = meta[_META_PATH][1][1][0].decode()
            if name not in columns:
                continue
            if meta[_META_CODEC][1] != _ZSTD or any(field in chunk for field in _PAGE_INDEX_FIELDS):
                raise ValueError(f"column {name}: expected a zstd chunk without page index")
            column = columns[name]
            pages = list(_pages(column, column.rows(first_row, rows), codec))
            for page in pages:
                pieces += [page.header, page.body]
            offset += _replace_chunk(row_group, meta, pages, offset, _encoding(column))
        first_row += rows
    footer = tc.encode_struct(metadata)
    return [*pieces, footer, struct.pack("<I", len(footer)), _MAGIC]


def _encoding(column: PackedList) -> int:
    return _BYTE_STREAM_SPLIT if column.byte_stream_split else _PLAIN


def _replace_chunk(
    row_group: tc.Struct, meta: tc.Struct, pages: list[_Page], offset: int, encoding: int
) -> int:
    """Point a column chunk's metadata at ``pages``, written at ``offset``; fix the row group's sizes.
    Returns the pages' size in the file."""
    uncompressed = sum(page.uncompressed_size for page in pages)
    compressed = sum(len(page.header) + page.body.size for page in pages)
    row_group[_GROUP_BYTES] = (
        tc.I64,
        row_group[_GROUP_BYTES][1] + uncompressed - meta[_META_UNCOMPRESSED][1],
    )
    if _GROUP_COMPRESSED in row_group:
        total = row_group[_GROUP_COMPRESSED][1] + compressed - meta[_META_COMPRESSED][1]
        row_group[_GROUP_COMPRESSED] = (tc.I64, total)
    for field in _META_NULL_CHUNK_ONLY:
        meta.pop(field, None)
    meta[_META_ENCODINGS] = (tc.LIST, (tc.I32, [_RLE, encoding]))
    meta[_META_VALUES] = (tc.I64, sum(page.levels for page in pages))
    meta[_META_UNCOMPRESSED] = (tc.I64, uncompressed)
    meta[_META_COMPRESSED] = (tc.I64, compressed)
    meta[_META_DATA_PAGE] = (tc.I64, offset)
    page_stats = {
        1: (tc.I32, _DATA_PAGE),
        2: (tc.I32, encoding),
        3: (tc.I32, len(pages)),
    }  # type, encoding, count
    meta[_META_ENCODING_STATS] = (tc.LIST, (tc.STRUCT, [page_stats]))
    ordered = dict(sorted(meta.items()))  # Thrift writers emit fields in id order
    meta.clear()
    meta.update(ordered)
    return compressed


def _pages(column: PackedList, rows: np.ndarray, codec: pa.Codec) -> Iterator[_Page]:
    """Data pages of ``column``'s ``rows`` (indices into ``packed``), in that order: each holds whole
    rows and about :data:`PAGE_BYTES` of values."""
    width = column.list_type.value_type.bit_width // 8
    byte_offsets = _byte_offsets(column.packed)
    if (byte_offsets % width).any():
        raise ValueError(f"packed values are not whole {width}-byte items")
    starts = byte_offsets[:-1][rows]
    lengths = (byte_offsets[1:][rows] - starts) // width
    valid = _is_valid(column.packed)[rows]
    if lengths[~valid].any():
        raise ValueError("a null list with values: check writable() first")
    repetition, repetition_at = _repetition_levels(lengths)
    definition, definition_at = _definition_levels(lengths, valid, column.definition)
    levels_before = np.concatenate([[0], np.cumsum(np.maximum(lengths, 1))])
    items = _items(column.packed, width)
    written_before = np.concatenate([[0], np.cumsum(lengths)]) * width
    page_of_row = written_before[:-1] // PAGE_BYTES
    page_starts = [0, *(np.flatnonzero(np.diff(page_of_row)) + 1).tolist()]
    for first, last in zip(page_starts, [*page_starts[1:], len(rows)], strict=True):
        body = _page_body(
            repetition[repetition_at[first] : repetition_at[last]],
            definition[definition_at[first] : definition_at[last]],
            items,
            starts[first:last] // width,
            lengths[first:last],
            column.byte_stream_split,
        )
        compressed = codec.compress(body)
        levels = int(levels_before[last] - levels_before[first])
        header = tc.encode_struct({  # PageHeader
            1: (tc.I32, _DATA_PAGE),  # type
            2: (tc.I32, len(body)),  # uncompressed_page_size
            3: (tc.I32, compressed.size),  # compressed_page_size
            5: (tc.STRUCT, {  # data_page_header
                1: (tc.I32, levels),  # num_values
                2: (tc.I32, _encoding(column)),  # encoding
                3: (tc.I32, _RLE),  # definition_level_encoding
                4: (tc.I32, _RLE),  # repetition_level_encoding
            }),
        })  # fmt: skip
        yield _Page(header, compressed, len(header) + len(body), levels)


def _items(packed: pa.Array, width: int) -> np.ndarray:
    """The values buffer of ``packed`` as unsigned integers of ``width`` bytes."""
    data = packed.buffers()[2]
    if data is None:
        return np.empty(0, f"<u{width}")
    return np.frombuffer(data, f"<u{width}", data.size // width)


def _page_body(
    repetition: np.ndarray,
    definition: np.ndarray,
    items: np.ndarray,
    starts: np.ndarray,
    counts: np.ndarray,
    split: bool,
) -> np.ndarray:
    """A v1 data page before compression: each level stream with its u32 length, then the values of
    rows ``items[starts[r] : starts[r] + counts[r]]``, PLAIN or BYTE_STREAM_SPLIT."""
    size = int(counts.sum()) * items.itemsize
    body = np.empty(8 + len(repetition) + len(definition) + size, np.uint8)
    at = 0
    for levels in (repetition, definition):
        body[at : at + 4] = np.frombuffer(struct.pack("<I", len(levels)), np.uint8)
        body[at + 4 : at + 4 + len(levels)] = levels
        at += 4 + len(levels)
    _gather_values(items, starts, counts, split, body[at:])
    return body


def _gather_values(
    items: np.ndarray, starts: np.ndarray, counts: np.ndarray, split: bool, out: np.ndarray
) -> None:
    """Rows of ``items`` one after another into the bytes ``out`` (BYTE_STREAM_SPLIT if ``split``)."""
    kernels = _kernels()
    if kernels is not None:
        kernels.gather_items(items, items.view(np.uint8), starts, counts, split, out)
        return
    written_before = np.cumsum(counts) - counts  # numpy: one index per value
    values = items[np.arange(int(counts.sum())) + np.repeat(starts - written_before, counts)]
    as_bytes = values.view(np.uint8)
    out[:] = as_bytes.reshape(-1, items.itemsize).T.ravel() if split else as_bytes


def warm_up() -> None:
    """Compile (or load from numba's cache) the page gather kernel before the first file needs it."""
    kernels = _kernels()
    if kernels is None:
        return
    items = np.frombuffer(bytes(8), "<u4")  # read-only, as the buffers of packed lists are
    starts, counts = np.zeros(1, np.int64), np.full(1, 2, np.int64)
    for split in (True, False):
        kernels.gather_items(items, items.view(np.uint8), starts, counts, split, np.empty(9, np.uint8)[1:])


@functools.cache
def _kernels() -> ModuleType | None:
    """The compiled ``gather_kernel`` when numba is installed (the ``collector`` extra), else ``None``."""
    try:
        from tinkertrace.spanstore.list_splice import gather_kernel
    except ImportError:
        return None
    return gather_kernel


def _byte_offsets(packed: pa.Array) -> np.ndarray:
    return np.frombuffer(packed.buffers()[1], np.int64, packed.offset + len(packed) + 1)[packed.offset :]


def _is_valid(array: pa.Array) -> np.ndarray:
    if array.null_count == 0:
        return np.ones(len(array), dtype=bool)
    bits = np.unpackbits(np.frombuffer(array.buffers()[0], np.uint8), bitorder="little")
    return bits[array.offset : array.offset + len(array)].astype(bool)


def _repetition_levels(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """RLE runs of each row's repetition levels: one 0, then a 1 for each further value."""
    return _rle_rows([(np.ones_like(lengths), 0), (np.maximum(lengths - 1, 0), 1)])


def _definition_levels(
    lengths: np.ndarray, valid: np.ndarray, levels: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """RLE runs of each row's definition levels: ``levels`` are those of an empty list and of a value;
    a null list is 0."""
    empty, value = levels
    row_level = np.where(lengths > 0, value, np.where(valid, empty, 0))
    return _rle_rows([(np.maximum(lengths, 1), row_level)])


def _rle_rows(runs: list[tuple[np.ndarray, np.ndarray | int]]) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ``(count, level)`` runs (a count of 0 writes nothing) in Parquet's RLE/bit-packed
    hybrid (levels < 256: one byte each), concatenated; and where each row's bytes start (n + 1)."""
    columns, used = [], []
    for counts, level in runs:
        header, header_used = _varints(counts << 1)  # an RLE run's header: count << 1
        present = counts > 0
        columns += [*header, np.broadcast_to(np.asarray(level, np.uint8), counts.shape)]
        used += [*(u & present for u in header_used), present]
    matrix, mask = np.column_stack(columns), np.column_stack(used)
    return matrix[mask], np.concatenate([[0], np.cumsum(mask.sum(axis=1))])


def _varints(numbers: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Unsigned LEB128 of each number as byte columns (as many as the largest needs), and which of
    them each number uses."""
    columns, used = [], []
    for k in range(max(1, (int(numbers.max(initial=0)).bit_length() + 6) // 7)):
        rest = numbers >> (7 * k)
        more = rest >= 0x80
        columns.append(((rest & 0x7F) | (more << 7)).astype(np.uint8))
        used.append(rest > 0 if k else np.ones(len(numbers), dtype=bool))
    return columns, used
