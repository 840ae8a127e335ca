"""Unit tests of the span store: OTLP → Arrow conversion, partitioned writer, DuckDB reader."""

from __future__ import annotations

import base64
import json
import threading
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tinkertrace import schemas, semconv
from tinkertrace.spanstore.convert import request_to_table
from tinkertrace.spanstore.reader import open_spans
from tinkertrace.spanstore.samples import llm_request
from tinkertrace.spanstore.writer import PartitionedParquetWriter, take_rows, write_parquet_atomic

HOUR_NS = 3_600_000_000_000
T0 = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z


def _expected_tokens(request: ExportTraceServiceRequest, key: str, dtype: str) -> list[list[float]]:
    out = []
    for span in request.resource_spans[0].scope_spans[0].spans:
        value = next(kv.value for kv in span.attributes if kv.key == key)
        if value.WhichOneof("value") == "bytes_value":
            out.append(np.frombuffer(value.bytes_value, dtype=dtype).tolist())
        else:
            out.append([v.int_value or v.double_value for v in value.array_value.values])
    return out


@pytest.mark.parametrize("packed", [True, False])
def test_conversion_lifts_columns_and_decodes_tokens(packed: bool) -> None:
    request = llm_request(25, prompt_tokens=40, response_tokens=12, packed=packed, seed=3)
    result = request_to_table(request, T0)
    table = result.table
    assert table.schema.equals(schemas.spans(), check_metadata=False)
    assert (result.accepted, result.rejected, result.errors) == (25, 0, [])
    rows = table.to_pydict()
    spans = request.resource_spans[0].scope_spans[0].spans
    assert rows["trace_id"] == [s.trace_id.hex() for s in spans]
    assert rows["span_id"] == [s.span_id.hex() for s in spans]
    assert all(len(t) == 32 and t == t.lower() for t in rows["trace_id"])
    assert rows["span_type"] == ["llm"] * 25
    assert rows["rollout_id"][10] == "rollout-3-1"
    assert rows["attempt"] == [0] * 25 and rows["policy_version"] == [3] * 25
    assert rows["service_name"] == ["agent"] * 25 and rows["kind"] == ["CLIENT"] * 25
    assert rows["prompt_token_ids"] == _expected_tokens(request, semconv.PROMPT_TOKEN_IDS, "<i4")
    assert rows["response_token_ids"] == _expected_tokens(request, semconv.RESPONSE_TOKEN_IDS, "<i4")
    expected_lp = _expected_tokens(request, semconv.RESPONSE_LOGPROBS, "<f4")
    assert np.allclose(np.concatenate(rows["response_logprobs"]), np.concatenate(expected_lp), atol=1e-6)
    attributes = json.loads(rows["attributes"][0])
    assert attributes[semconv.GENAI_OPERATION] == "chat"
    assert semconv.ROLLOUT_ID not in attributes and semconv.PROMPT_TOKEN_IDS not in attributes
    assert json.loads(rows["events"][0])[0]["name"] == "gen_ai.choice"
    assert json.loads(rows["resource_attributes"][0]) == {"service.name": "agent"}


def test_spans_without_tokens_get_null_lists_and_other_values_become_json() -> None:
    request = llm_request(3, seed=1)
    span = request.resource_spans[0].scope_spans[0].spans[1]
    del span.attributes[:]
    span.attributes.add(key="blob").value.bytes_value = b"\x00\x01"
    span.attributes.add(key=semconv.ATTEMPT).value.string_value = "not-a-number"
    link = span.links.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8)
    link.attributes.add(key="why").value.string_value = "retry"
    rows = request_to_table(request, T0).table.to_pydict()
    assert rows["prompt_token_ids"][1] is None and rows["prompt_token_ids"][0] is not None
    assert rows["attempt"][1] is None
    assert json.loads(rows["attributes"][1]) == {
        "blob": base64.b64encode(b"\x00\x01").decode(),
        semconv.ATTEMPT: "not-a-number",
    }
    assert json.loads(rows["links"][1]) == [
        {"trace_id": "01" * 16, "span_id": "02" * 8, "attributes": {"why": "retry"}}
    ]


def test_invalid_spans_are_rejected_with_reasons() -> None:
    request = llm_request(5, seed=2)
    spans = request.resource_spans[0].scope_spans[0].spans
    spans[0].trace_id = b""
    spans[2].span_id = b"\x00" * 8
    next(kv for kv in spans[4].attributes if kv.key == semconv.PROMPT_TOKEN_IDS).value.bytes_value = b"abc"
    result = request_to_table(request, T0)
    assert (result.accepted, result.rejected) == (2, 3)
    assert "trace_id must be 16 non-zero bytes, got 0" in result.errors[0]
    assert "span_id" in result.errors[1] and "span[2]" in result.errors[1]
    assert "not a multiple of 4" in result.errors[2]
    assert result.table.column("span_id").to_pylist() == [spans[1].span_id.hex(), spans[3].span_id.hex()]


def test_empty_request_gives_empty_table() -> None:
    result = request_to_table(ExportTraceServiceRequest(), T0)
    assert result.table.num_rows == 0 and result.accepted == 0
    assert result.table.schema.equals(schemas.spans(), check_metadata=False)


def test_writer_partitions_sorts_and_reads_back(tmp_path: Path) -> None:
    writer = PartitionedParquetWriter(tmp_path, max_file_age_s=3600)
    first = request_to_table(llm_request(30, seed=1), T0 + 5).table
    second = request_to_table(llm_request(20, seed=2), T0 + HOUR_NS + 7).table
    assert writer.write(first) == [] and writer.write(second) == []
    assert list(tmp_path.rglob("*.parquet")) == []  # buffered until flush
    files = writer.close()
    assert sorted(str(f.parent.relative_to(tmp_path)) for f in files) == [
        "date=2026-01-01/hour=00",
        "date=2026-01-01/hour=01",
    ]
    meta = pq.read_metadata(files[0])
    assert meta.row_group(0).column(0).compression == "ZSTD"
    table = pq.read_table(files[0], partitioning=None)
    keys = list(zip(*(table.column(k).to_pylist() for k in schemas.sort_keys("spans")), strict=True))
    assert keys == sorted(keys)
    con = duckdb.connect()
    report = open_spans(con, tmp_path)
    assert len(report.files) == 2 and report.skipped == []
    empty = duckdb.connect()
    open_spans(empty, tmp_path / "nothing")
    assert con.execute("DESCRIBE spans").fetchall() == empty.execute("DESCRIBE spans").fetchall()
    assert con.execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchone() == (50, 50)
    assert con.execute("SELECT hour, count(*) FROM spans GROUP BY ALL ORDER BY 1").fetchall() == [
        (0, 30),
        (1, 20),
    ]
    ids = con.execute("SELECT prompt_token_ids FROM spans WHERE span_id = ?", [first["span_id"][0].as_py()])
    assert ids.fetchone()[0] == first["prompt_token_ids"][0].as_py()


def test_written_file_equals_arrows_own_sort_with_split_token_streams(tmp_path: Path) -> None:
    """The packed-bytes sort is exact (nulls, several chunks); token values are BYTE_STREAM_SPLIT."""
    tables = [request_to_table(llm_request(40, seed=s), T0).table for s in range(3)]
    untraced = llm_request(6, seed=9)
    for span in untraced.resource_spans[0].scope_spans[0].spans[::2]:
        del span.attributes[:]  # no token arrays: null lists
    table = pa.concat_tables([*tables, request_to_table(untraced, T0).table])
    assert table.column("prompt_token_ids").null_count == 3
    path = tmp_path / "x.parquet"
    write_parquet_atomic(table, path)
    expected = table.sort_by([(k, "ascending") for k in schemas.sort_keys("spans")])
    assert pq.read_table(path).equals(expected)
    column = pq.read_metadata(path).row_group(0).column(table.schema.get_field_index("prompt_token_ids"))
    assert "BYTE_STREAM_SPLIT" in column.encodings


def test_take_rows_matches_take_on_sliced_lists_with_nulls() -> None:
    rng = np.random.default_rng(0)
    lists = [
        None if rng.random() < 0.2 else rng.integers(0, 9, rng.integers(0, 4)).tolist() for _ in range(200)
    ]
    table = pa.table(
        {
            "ids": pa.array(lists, pa.list_(pa.int32())),
            "probs": pa.array(
                [None if x is None else [v / 2 for v in x] for x in lists], pa.list_(pa.float32())
            ),
            "name": pa.array([str(i) for i in range(200)]),
        }
    )
    chunked = pa.concat_tables([table.slice(5, 50), table.slice(70, 100)])  # offsets into shared buffers
    indices = pa.array(rng.permutation(chunked.num_rows))
    taken = take_rows(chunked, indices)
    taken.validate(full=True)
    assert taken.equals(chunked.take(indices))
    sliced = pa.table({"ids": table.column("ids").combine_chunks().slice(3, 40)})
    indices = pa.array(rng.permutation(40))
    assert take_rows(sliced, indices).equals(sliced.take(indices))


def test_one_table_across_two_hours_is_split_into_both_partitions(tmp_path: Path) -> None:
    first = request_to_table(llm_request(30, seed=1), T0 + 5).table
    second = request_to_table(llm_request(20, seed=2), T0 + HOUR_NS + 7).table
    writer = PartitionedParquetWriter(tmp_path, max_file_age_s=3600)
    writer.write(pa.concat_tables([first, second]).combine_chunks())
    files = sorted(writer.close())
    assert [pq.read_metadata(f).num_rows for f in files] == [30, 20]
    hour_one = pq.read_table(files[1], partitioning=None)
    expected = second.sort_by([(k, "ascending") for k in schemas.sort_keys("spans")])
    assert hour_one.equals(expected)


def test_writer_rolls_by_size_and_age(tmp_path: Path) -> None:
    table = request_to_table(llm_request(10, seed=1), T0).table
    by_size = PartitionedParquetWriter(
        tmp_path / "size", max_file_bytes=table.get_total_buffer_size() * 2, max_file_age_s=3600
    )
    written = [f for _ in range(5) for f in by_size.write(table)]
    assert len(written) == 2 and by_size.buffered_bytes == table.get_total_buffer_size()
    by_age = PartitionedParquetWriter(tmp_path / "age", max_file_age_s=0.0)
    assert len(by_age.write(table)) == 1


def test_writer_is_thread_safe(tmp_path: Path) -> None:
    writer = PartitionedParquetWriter(tmp_path, max_file_bytes=200_000, max_file_age_s=3600)
    tables = [request_to_table(llm_request(20, seed=s), T0).table for s in range(8)]
    threads = [threading.Thread(target=writer.write, args=(t,)) for t in tables]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    writer.close()
    con = duckdb.connect()
    open_spans(con, tmp_path)
    assert con.execute("SELECT count(*), count(DISTINCT span_id) FROM spans").fetchone() == (160, 160)


def test_reader_skips_corrupt_and_temp_files(tmp_path: Path) -> None:
    with PartitionedParquetWriter(tmp_path) as writer:
        writer.write(request_to_table(llm_request(10, seed=1), T0).table)
    folder = tmp_path / "date=2026-01-01" / "hour=00"
    (folder / "broken.parquet").write_bytes(b"PAR1 this is not parquet")
    (folder / ".half-written.parquet.tmp").write_bytes(b"PAR1")
    (folder / ".hidden.parquet").write_bytes(b"PAR1")
    con = duckdb.connect()
    report = open_spans(con, tmp_path)
    assert len(report.files) == 1
    assert [p.name for p, _ in report.skipped] == ["broken.parquet"]
    assert "unreadable Parquet" in report.skipped[0][1]
    assert con.execute("SELECT count(*) FROM spans").fetchone() == (10,)


@pytest.mark.parametrize("make", [lambda p: p / "missing", lambda p: p])
def test_reader_empty_or_missing_folder_gives_empty_view(tmp_path: Path, make) -> None:
    con = duckdb.connect()
    report = open_spans(con, make(tmp_path), view="s")
    assert report.files == [] and report.skipped == []
    columns = [row[0] for row in con.execute("DESCRIBE s").fetchall()]
    assert columns == [*schemas.spans().names, "filename", "date", "hour"]
    assert con.execute("SELECT count(*) FROM s").fetchone() == (0,)
    types = dict(con.execute("SELECT column_name, column_type FROM (DESCRIBE s)").fetchall())
    assert types["prompt_token_ids"] == "INTEGER[]" and types["start_time"] == "TIMESTAMPTZ_NS"
