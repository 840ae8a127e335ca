"""List columns written from packed values (``list_splice``) read back exactly, with Arrow and DuckDB, and
as the tables ``pyarrow.parquet`` writes."""

from __future__ import annotations

import struct
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tinkertrace import schemas
from tinkertrace.spanstore.convert import request_to_table
from tinkertrace.spanstore.encoding import lists_as_binary
from tinkertrace.spanstore.list_splice import splice, thrift_compact
from tinkertrace.spanstore.samples import llm_request
from tinkertrace.spanstore.writer import TOKEN_COLUMNS, write_parquet_atomic

IDS = pa.list_(pa.int32())
PROBS = pa.list_(pa.float32())
T0 = 1_767_225_600_000_000_000


def _random_lists(rng: np.random.Generator, n: int, *, nulls: bool, long: bool = False) -> list:
    rows = []
    for _ in range(n):
        draw = rng.random()
        if nulls and draw < 0.15:
            rows.append(None)
        elif draw < 0.25:
            rows.append([])
        else:
            size = int(rng.integers(20_000, 30_000)) if long and draw > 0.97 else int(rng.integers(1, 400))
            rows.append(rng.integers(-(2**31), 2**31 - 1, size).tolist())
    return rows


def _write(
    table: pa.Table,
    path: Path,
    *,
    split: bool = True,
    order: np.ndarray | None = None,
    **arrow_options: object,
) -> None:
    """``table`` (in ``order``) with its list columns written by ``list_splice``."""
    lists = {
        field.name: splice.PackedList.of(field, lists_as_binary(table.column(field.name)), split, order)
        for field in table.schema
        if pa.types.is_list(field.type)
    }
    written = table if order is None else table.take(order)
    pieces = splice.parquet_pieces(written, lists, 1, write_statistics=False, **arrow_options)
    with open(path, "wb") as out:
        for piece in pieces:
            out.write(piece)


def _table(rng: np.random.Generator, n: int, *, nullable: bool = True, long: bool = False) -> pa.Table:
    ids = _random_lists(rng, n, nulls=nullable, long=long)
    probs = [None if row is None else (np.asarray(row[:50]) / 2**31).tolist() for row in ids]
    strict = pa.list_(pa.field("item", pa.int32(), nullable=False))  # values that are never null
    schema = pa.schema(
        [
            pa.field("row", pa.int64(), nullable=False),
            pa.field("ids", IDS, nullable=nullable),
            pa.field("probs", PROBS, nullable=nullable),
            pa.field("strict", strict, nullable=nullable),
            pa.field("name", pa.string()),
        ]
    )
    columns = [range(n), ids, probs, ids, ["x"] * n]
    return pa.table([pa.array(c, f.type) for c, f in zip(columns, schema, strict=True)], schema=schema)


def _duckdb_rows(path: Path) -> list[tuple]:
    return duckdb.sql(f"SELECT row, ids, probs, strict FROM '{path}' ORDER BY row").fetchall()


@pytest.mark.parametrize("split", [True, False], ids=["byte_stream_split", "plain"])
@pytest.mark.parametrize("nullable", [True, False], ids=["nullable", "required"])
def test_lists_read_back_with_arrow_and_duckdb(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, split: bool, nullable: bool
) -> None:
    """Null, empty and long lists (3-byte run lengths), several pages and row groups, both list and
    value nullabilities, both value encodings."""
    monkeypatch.setattr(splice, "PAGE_BYTES", 16 * 1024)
    table = _table(np.random.default_rng(7), 1_500, nullable=nullable, long=True)
    path = tmp_path / "lists.parquet"
    _write(table, path, split=split, row_group_size=400)

    assert pq.read_table(path).equals(table)
    expected = [
        (row["row"], row["ids"], row["probs"], row["strict"]) for row in table.to_pylist()
    ]  # fmt: skip
    assert _duckdb_rows(path) == expected
    metadata = pq.read_metadata(path)
    assert metadata.num_row_groups == 4
    encoding = "BYTE_STREAM_SPLIT" if split else "PLAIN"
    for group in range(metadata.num_row_groups):
        column = metadata.row_group(group).column(1)
        assert column.encodings == ("RLE", encoding)
        assert not column.is_stats_set


@pytest.mark.parametrize("split", [True, False], ids=["byte_stream_split", "plain"])
@pytest.mark.parametrize("compiled", [True, False], ids=["numba", "numpy"])
def test_lists_are_written_in_the_given_row_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, split: bool, compiled: bool
) -> None:
    """Rows gathered in another order than stored (a file's sort) keep their own values, across
    pages and row groups, with the compiled gather and with numpy's."""
    if compiled:
        pytest.importorskip("numba", reason="the compiled gather needs the collector extra (numba)")
    else:
        monkeypatch.setattr(splice, "_kernels", lambda: None)
    monkeypatch.setattr(splice, "PAGE_BYTES", 16 * 1024)
    table = _table(np.random.default_rng(11), 1_200, long=True)
    order = np.random.default_rng(12).permutation(1_200)
    path = tmp_path / "ordered.parquet"
    _write(table, path, split=split, order=order, row_group_size=500)

    assert pq.read_table(path).equals(table.take(order))
    expected = [
        (row["row"], row["ids"], row["probs"], row["strict"]) for row in table.to_pylist()
    ]  # fmt: skip
    assert _duckdb_rows(path) == expected  # ORDER BY row: every list is still on its own row


def test_footer_counts_match_arrows_own_file(tmp_path: Path) -> None:
    """Each chunk's value count (levels) is what Arrow writes for the same lists; sizes add up."""
    table = _table(np.random.default_rng(3), 2_000)
    ours, arrows = tmp_path / "ours.parquet", tmp_path / "arrow.parquet"
    _write(table, ours, row_group_size=700)
    pq.write_table(table, arrows, compression="zstd", row_group_size=700)
    mine, theirs = pq.read_metadata(ours), pq.read_metadata(arrows)
    for group in range(mine.num_row_groups):
        for column in range(1, 4):
            assert (
                mine.row_group(group).column(column).num_values
                == theirs.row_group(group).column(column).num_values
            )
        chunks = [mine.row_group(group).column(c) for c in range(mine.num_columns)]
        assert mine.row_group(group).total_byte_size == sum(c.total_uncompressed_size for c in chunks)
        for chunk in chunks:
            assert chunk.data_page_offset + chunk.total_compressed_size <= ours.stat().st_size


def _two_spans_with_prompts(prompts: pa.Array) -> pa.Table:
    """Two rows of the spans schema: nulls where allowed, and these prompt token ids."""
    schema = schemas.spans()
    columns = {
        field.name: pa.nulls(2, field.type)
        if field.nullable
        else pa.array(["a", "b"] if pa.types.is_string(field.type) else [1, 2], field.type)
        for field in schema
    }
    columns["prompt_token_ids"] = prompts
    return pa.table(columns, schema=schema)


def test_spans_file_without_packable_lists_falls_back_to_arrow(tmp_path: Path) -> None:
    """A token list holding a null value cannot be packed: Arrow writes that column itself."""
    rows = _two_spans_with_prompts(pa.array([[1, None, 3], [4]], IDS))
    assert lists_as_binary(rows.column("prompt_token_ids")) is None
    path = tmp_path / "spans.parquet"
    write_parquet_atomic(rows, path, splice_lists=True)
    assert pq.read_table(path).column("prompt_token_ids").to_pylist() == [[1, None, 3], [4]]


def test_null_lists_covering_values_are_left_to_arrow(tmp_path: Path) -> None:
    """Arrow lets a null list's offsets cover values; such a column is not packed but still written."""
    covering = pa.ListArray.from_arrays(
        pa.array([0, 2, 4], pa.int32()), pa.array([1, 2, 3, 4], pa.int32()), mask=pa.array([False, True])
    )
    packed = lists_as_binary(pa.chunked_array([covering]))
    assert packed is not None and not splice.writable(packed)
    assert splice.writable(packed.slice(0, 1))
    rows = _two_spans_with_prompts(covering)
    assert "prompt_token_ids" not in splice.packed_lists(rows, TOKEN_COLUMNS, ())
    path = tmp_path / "spans.parquet"
    write_parquet_atomic(rows, path, splice_lists=True)
    assert pq.read_table(path).column("prompt_token_ids").to_pylist() == [[1, 2], None]


def test_thrift_codec_round_trips_arrows_footer_and_rejects_truncation(tmp_path: Path) -> None:
    path = tmp_path / "arrow.parquet"
    pq.write_table(_table(np.random.default_rng(1), 50), path)
    data = path.read_bytes()
    size = struct.unpack("<I", data[-8:-4])[0]
    footer = data[-8 - size : -8]
    decoded, end = thrift_compact.decode_struct(footer)
    assert end == len(footer)
    assert decoded[3] == (thrift_compact.I64, 50)  # num_rows
    assert thrift_compact.encode_struct(decoded) == footer
    with pytest.raises(thrift_compact.ThriftError, match="truncated"):
        thrift_compact.decode_struct(footer[: len(footer) // 2])


def test_splice_refuses_what_it_does_not_write(tmp_path: Path) -> None:
    table = _table(np.random.default_rng(2), 10)
    field = table.schema.field("ids")
    lists = {"ids": splice.PackedList.of(field, lists_as_binary(table.column("ids")), True)}
    with pytest.raises(ValueError, match="not a Parquet file"):
        splice.splice(b"PAR1 nonsense", lists, 1)
    snappy = pa.BufferOutputStream()
    pq.write_table(table, snappy, compression="snappy")
    with pytest.raises(ValueError, match="column ids: expected a zstd chunk"):
        splice.splice(snappy.getvalue(), lists, 1)


def _spans_with_lists(rng: np.random.Generator, n: int) -> pa.Table:
    """``n`` spans (several rollouts, shuffled) whose token lists are null, empty, short or long."""
    table = request_to_table(llm_request(n, prompt_tokens=8, response_tokens=4, seed=3), T0).table
    table = table.take(rng.permutation(n))
    ids = _random_lists(rng, n, nulls=True, long=True)
    logprobs = [None if row is None else (np.asarray(row[:300]) / 2**31).tolist() for row in ids]
    table = table.set_column(
        table.schema.get_field_index("prompt_token_ids"), "prompt_token_ids", pa.array(ids, IDS)
    )
    index = table.schema.get_field_index("response_logprobs")
    return table.set_column(index, table.schema.field(index), pa.array(logprobs, PROBS))


@pytest.mark.parametrize("rows_per_group", [97, 256 * 1024], ids=["many_row_groups", "one_row_group"])
def test_spliced_and_plain_pyarrow_files_hold_the_same_table(tmp_path: Path, rows_per_group: int) -> None:
    """The collector's splice and plain ``pyarrow.parquet`` (every other writer) write the same table:
    schema with its metadata, and rows, over null, empty and long lists, one or many row groups."""
    table = _spans_with_lists(np.random.default_rng(21), 1_000)
    assert set(splice.packed_lists(table, TOKEN_COLUMNS, ())) == set(TOKEN_COLUMNS)  # all three spliced
    files = {}
    for splice_lists in (True, False):
        files[splice_lists] = tmp_path / f"spliced-{splice_lists}.parquet"
        write_parquet_atomic(
            table, files[splice_lists], splice_lists=splice_lists, row_group_rows=rows_per_group
        )
    spliced, plain = (pq.read_table(files[flag], partitioning=None) for flag in (True, False))
    assert spliced.schema.equals(plain.schema, check_metadata=True)
    assert spliced.schema.metadata == plain.schema.metadata
    assert spliced.equals(plain)
    assert pq.read_metadata(files[True]).num_row_groups == pq.read_metadata(files[False]).num_row_groups
    assert sorted(spliced.column("span_id").to_pylist()) == sorted(table.column("span_id").to_pylist())


def test_a_token_list_with_a_null_value_is_written_alike_by_both_paths(tmp_path: Path) -> None:
    rows = _two_spans_with_prompts(pa.array([[1, None, 3], []], IDS))
    for splice_lists in (True, False):
        write_parquet_atomic(rows, tmp_path / f"{splice_lists}.parquet", splice_lists=splice_lists)
    assert pq.read_table(tmp_path / "True.parquet").equals(pq.read_table(tmp_path / "False.parquet"))
