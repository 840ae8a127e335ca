"""The ordered triplet stream, produced bucket by bucket so its memory is bounded.

Each chosen call gets ``call_no``, its position in the output order ((group_key,) rollout_id,
turn). The calls are cut into K buckets of consecutive ``call_no`` ranges (equal call counts), so
streaming bucket 0, then 1, ... gives exactly the globally sorted stream while DuckDB only ever
holds one bucket's token lists. One scan of the span files joins the calls with their token columns
(DuckDB) and appends each row to its bucket's temporary Arrow IPC file; each bucket is then
read back, put in ``call_no`` order with one Arrow ``take`` and streamed as record batches.
K comes from the token data's size in the span files' Parquet metadata and the DuckDB memory limit
(or ``BuildSettings.buckets``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from tinkertrace.builder import views
from tinkertrace.builder.options import MAX_BUCKETS
from tinkertrace.builder.views import Relation
from tinkertrace.schemas.columns import TOKEN_COLUMNS

TRIPLET_COLUMNS = (
    "rollout_id", "task_id", "attempt", "agent_name", "turn", "span_id", "response_id", "model",
    "policy_version", *TOKEN_COLUMNS, "token_source", "reward", "truncated", "response_policy_versions",
)  # fmt: skip
# Triplet columns read with the token ids (from the span that carries them), the rest from the calls.
TOKEN_SIDE = (*TOKEN_COLUMNS, "response_policy_versions")


def _response_versions_sql(runs: str, ids: str, version: str) -> str:
    """SQL: the policy version of each response token — the flat [version, count, ...] ``runs``
    expanded when their counts sum to the number of ``ids``, else ``version`` repeated (or null)."""
    pairs = f"range(len({runs}) // 2)"
    run = f"list_transform(range({runs}[2 * i + 2]), lambda j: {runs}[2 * i + 1])"  # run i's tokens
    expanded = f"flatten(list_transform({pairs}, lambda i: {run}))"
    counted = f"list_sum(list_transform({pairs}, lambda i: {runs}[2 * i + 2]))"
    return f"""CASE WHEN {counted} = len({ids}) THEN {expanded}
                WHEN {version} IS NOT NULL THEN list_transform(range(len({ids})), lambda j: {version})
           END"""


# Columns of the stream after the triplet columns, used to build trajectories.
EXTRA_COLUMNS = ("group_key", "traj_reward", "split", "rollout_end")

# A bucket's token data may take this share of the memory limit (reading, reordering and
# merging it in Python costs about four times its size on top of DuckDB's limit).
BUCKET_SHARE = 1 / 32
# DuckDB's share of the memory limit while the buckets are processed.
DUCKDB_SHARE = 3 / 4
_UNITS = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50}


def memory_limit_bytes(con: duckdb.DuckDBPyConnection) -> int:
    """DuckDB's effective memory limit in bytes (``current_setting`` prints e.g. ``244.1 MiB``)."""
    text = str(con.sql("SELECT current_setting('memory_limit')").fetchall()[0][0])
    match = re.fullmatch(r"\s*([\d.]+)\s*(\w+)\s*", text)
    if match is None or match.group(2) not in _UNITS:
        raise ValueError(f"cannot read DuckDB memory limit {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def token_bytes(con: duckdb.DuckDBPyConnection, files: list[Path]) -> int:
    """Estimated in-memory size of the token columns of ``files``: 4 bytes a value (int32/float32),
    from the Parquet footers only."""
    if not files:
        return 0
    cols = " OR ".join(f"path_in_schema LIKE '{c},%'" for c in TOKEN_COLUMNS)
    ((values,),) = con.sql(
        f"SELECT sum(num_values) FROM parquet_metadata($files) WHERE {cols}",
        params={"files": [str(f) for f in files]},
    ).fetchall()
    return 4 * int(values or 0)


def choose_buckets(data_bytes: int, limit_bytes: int) -> int:
    """How many buckets keep one bucket's token data within :data:`BUCKET_SHARE` of the limit."""
    return max(1, min(MAX_BUCKETS, math.ceil(data_bytes / max(1.0, limit_bytes * BUCKET_SHARE))))


def _tokens_sql(con: duckdb.DuckDBPyConnection, chosen: Relation, typed: Relation) -> str:
    """``bucket``, ``call_no`` and the token columns (from ``typed``) of the ``chosen`` calls, in no
    particular order.
    Joined on (trace_id, span_id, source file), so a span delivered twice contributes one row;
    calls without prompt or response ids are dropped."""
    tokens = ", ".join(f"t.{c}" for c in TOKEN_COLUMNS)
    versions = _response_versions_sql("t.policy_version_runs", "t.response_token_ids", "c.policy_version")
    # a call takes the token columns of span tok_trace_id/tok_span_id where it names one (calls seen
    # by several producers or sides: views.llm_calls_sql), else of its own span
    columns = [d[0] for d in con.execute(f"SELECT * FROM {chosen} LIMIT 0").description]
    tok = "tok_" if "tok_span_id" in columns else ""
    return f"""
        SELECT c.bucket, c.call_no, {tokens}, {versions} AS response_policy_versions
        FROM ({views.span_tokens_sql(typed)}) t
        JOIN (SELECT bucket, call_no, {tok}trace_id, {tok}span_id, filename, policy_version FROM {chosen}) c
          ON t.trace_id = c.{tok}trace_id AND t.span_id = c.{tok}span_id AND t.filename = c.filename
        WHERE t.prompt_token_ids IS NOT NULL AND t.response_token_ids IS NOT NULL"""


def _spill(
    con: duckdb.DuckDBPyConnection, chosen: Relation, typed: Relation, buckets: int, batch_rows: int,
    work: Path,
) -> list[Path]:  # fmt: skip
    """One scan: each joined token row goes to its bucket's Arrow IPC file; returns the files."""
    paths = [work / f"tokens-{b:03d}.arrow" for b in range(buckets)]
    # The hash table must hold the token-free chosen calls (the join's right side) while the span files
    # stream past it in file order; DuckDB would otherwise build on the side with fewer estimated
    # rows, the token lists, and emit them in no useful order.
    con.execute("SET disabled_optimizers = 'build_side_probe_side'")
    try:
        reader = con.sql(_tokens_sql(con, chosen, typed)).to_arrow_reader(batch_rows)
    except BaseException:
        con.execute("RESET disabled_optimizers")
        raise
    schema = reader.schema.remove(0)  # without `bucket`
    writers = [pa.ipc.new_file(p, schema) for p in paths]
    try:
        for batch in reader:
            bucket = batch.column(0).to_numpy()
            rows = batch.drop_columns(["bucket"])
            if np.any(bucket[1:] < bucket[:-1]):  # usually already in order (files follow time)
                order = np.argsort(bucket, kind="stable")
                bucket, rows = bucket[order], rows.take(pa.array(order))
            bounds = np.searchsorted(bucket, np.arange(buckets + 1))
            for b in np.flatnonzero(np.diff(bounds)):
                writers[b].write_batch(rows.slice(bounds[b], bounds[b + 1] - bounds[b]))
    finally:
        reader.close()
        con.execute("RESET disabled_optimizers")
        for writer in writers:
            writer.close()
    return paths


def _bucket_rows(con: duckdb.DuckDBPyConnection, chosen: Relation, bucket: int, path: Path) -> pa.Table:
    """Bucket ``bucket``'s triplet rows (+ extra columns) sorted by ``call_no``."""
    with pa.OSFile(str(path)) as source:  # read, not mapped: the file's pages would count as ours
        tokens = pa.ipc.open_file(source).read_all()
    call_no = tokens.column("call_no").to_numpy()
    if np.any(call_no[1:] < call_no[:-1]):
        order = np.argsort(call_no, kind="stable")
        call_no, tokens = call_no[order], tokens.take(pa.array(order))
    other = [c for c in (*TRIPLET_COLUMNS, *EXTRA_COLUMNS) if c not in TOKEN_SIDE]
    calls = con.sql(
        f"SELECT call_no, {', '.join(other)} FROM {chosen} WHERE bucket = $b ORDER BY call_no",
        params={"b": bucket},
    ).to_arrow_table()
    at = np.searchsorted(calls.column("call_no").to_numpy(), call_no)
    calls = calls.take(pa.array(at))
    columns = {name: (tokens if name in TOKEN_SIDE else calls).column(name) for name in TRIPLET_COLUMNS}
    columns.update({name: calls.column(name) for name in EXTRA_COLUMNS})
    return pa.table(columns)


def triplet_stream(
    con: duckdb.DuckDBPyConnection, chosen: Relation, typed: Relation, batch_rows: int, buckets: int,
    work: Path,
) -> Iterator[pa.RecordBatch]:  # fmt: skip
    """The ``chosen`` calls (with ``call_no`` and ``bucket`` < ``buckets``) with their token ids from
    the span view ``typed``, in ``call_no`` order, triplet columns first, then :data:`EXTRA_COLUMNS`;
    computed bucket by bucket (temporary Arrow files under ``work``)."""
    # DuckDB needs less from here on (the token-free calls and the join's keys); lowering its limit
    # also returns what the first pass left in its allocator, so the buckets' Python side fits.
    limit = memory_limit_bytes(con)
    con.execute(f"SET memory_limit = '{int(limit * DUCKDB_SHARE) // 1024}KiB'")
    for bucket, path in enumerate(_spill(con, chosen, typed, buckets, batch_rows, work)):
        table = _bucket_rows(con, chosen, bucket, path)
        path.unlink()
        yield from table.to_batches(batch_rows)
        del table
        pa.default_memory_pool().release_unused()  # the next bucket's peak starts from here
