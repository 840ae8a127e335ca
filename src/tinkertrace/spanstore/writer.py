"""Hive-partitioned, atomically written Parquet files of spans.

Rows are buffered per partition ``date=YYYY-MM-DD/hour=HH/`` (UTC, from ``received_at``) and written
when a partition's buffer reaches ``max_file_bytes`` or its oldest row is ``max_file_age_s`` old, or
on :meth:`flush`. Each file is written under a hidden temporary name in its folder, fsynced, then
renamed, so a reader globbing ``**/*.parquet`` never sees a partial file.

Files are written by ``pyarrow.parquet``. The collector opts into ``splice_lists``: the token list
columns are then written from their packed values by ``list_splice`` (about 6 of a span's 10 µs of
writing saved); the tables read back are the same either way (tests/spanstore/test_list_splice.py).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tinkertrace.durable import fsync_path
from tinkertrace.schemas import sort_keys
from tinkertrace.schemas.columns import JSON_COLUMNS, TOKEN_COLUMNS
from tinkertrace.spanstore import ZSTD_LEVEL
from tinkertrace.spanstore.encoding import lists_as_binary, lists_from_packed
from tinkertrace.spanstore.list_splice import splice

TEMP_PREFIX = "."  # temporary files are hidden: ".<name>.tmp"
DICTIONARY_COLUMNS = [
    "name",
    "kind",
    "status_code",
    "service_name",
    "scope_name",
    "span_type",
    "rollout_id",
    "task_id",
    "split",
    "agent_name",
    "model",
    "reward_name",
    "token_source",
    "resource_attributes",
]

# min/max statistics of token arrays (~1 µs per span) and of the JSON columns are never used for pruning
NO_STATISTICS_COLUMNS = (*TOKEN_COLUMNS, *JSON_COLUMNS)
# BYTE_STREAM_SPLIT values of the token arrays: the high bytes of token ids (and of logprobs' exponents)
# form near-constant streams, so zstd(1) packs them 17% smaller and ~2 µs per span faster
# (benchmarks/collector_convert.py). Readers need BYTE_STREAM_SPLIT for INT32: DuckDB >= 2.0 (1.x reads it
# for floats only) and pyarrow >= 17. An empty tuple here writes plain values again.
BYTE_STREAM_SPLIT_COLUMNS = TOKEN_COLUMNS
# Arrow's Parquet writer builds repetition/definition levels per chunk: chunks of this many rows keep
# those buffers small (one 50k-row chunk grows them by reallocation to ~50 MB each) for the list columns
# it writes itself (all of them, or with splice_lists those with null values)
WRITE_CHUNK_ROWS = 4096
ROW_GROUP_ROWS = 256 * 1024

Partition = tuple[str, str]  # ("2026-01-31", "07")


def partition_dir(root: Path, partition: Partition) -> Path:
    return root / f"date={partition[0]}" / f"hour={partition[1]}"


def partition_of_ns(ns: int) -> Partition:
    moment = datetime.fromtimestamp(ns / 1e9, tz=UTC)
    return moment.strftime("%Y-%m-%d"), moment.strftime("%H")


def sort_order(table: pa.Table) -> pa.Array | None:
    """The row order of ``schemas.sort_keys("spans")`` (the keys ``table`` has); ``None``: keep it."""
    keys = [(k, "ascending") for k in sort_keys("spans") if k in table.column_names]
    if not keys or table.num_rows < 2:
        return None
    return pc.sort_indices(table, sort_keys=keys)


def take_rows(table: pa.Table, indices: pa.Array) -> pa.Table:
    """``table.take(indices)``, moving lists of fixed-width values as single binary blobs.

    Arrow's ``take`` on a list column copies element by element (~3 µs per span for the token
    arrays); taking each list's packed bytes as one binary value and re-wrapping them is exact and
    ~6x cheaper.
    """
    columns = []
    for field_, column in zip(table.schema, table.columns, strict=True):
        packed = lists_as_binary(column) if pa.types.is_list(field_.type) else None
        if packed is None:
            columns.append(column.take(indices))
        else:
            columns.append(lists_from_packed(packed.take(indices), field_.type))
    return pa.Table.from_arrays(columns, schema=table.schema)


def write_parquet_atomic(
    table: pa.Table,
    path: Path,
    compression_level: int | None = None,
    *,
    splice_lists: bool = False,
    row_group_rows: int = ROW_GROUP_ROWS,
) -> None:
    """Write ``table`` (sorted by the spans sort keys) to ``path`` via temp file + fsync + rename, zstd
    at ``compression_level`` (default :data:`ZSTD_LEVEL`). With ``splice_lists`` the token lists are
    written by ``list_splice`` (see the module docstring)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    options: dict[str, Any] = {
        "use_dictionary": [c for c in DICTIONARY_COLUMNS if c in table.column_names],
        "write_statistics": [c for c in table.column_names if c not in NO_STATISTICS_COLUMNS],
        "use_byte_stream_split": [
            f"{c}.list.element" for c in BYTE_STREAM_SPLIT_COLUMNS if c in table.column_names
        ],
        "row_group_size": row_group_rows,
    }
    level = ZSTD_LEVEL if compression_level is None else compression_level
    order = sort_order(table)
    if splice_lists:
        lists = splice.packed_lists(
            table, TOKEN_COLUMNS, BYTE_STREAM_SPLIT_COLUMNS, None if order is None else order.to_numpy()
        )
        table = splice.as_nulls(table, lists)  # list_splice writes them, in sorted order
        pieces = splice.parquet_pieces(_in_write_chunks(table, order), lists, level, **options)
    else:
        file = pa.BufferOutputStream()
        pq.write_table(
            _in_write_chunks(table, order), file, compression="zstd", compression_level=level, **options
        )
        pieces = [file.getvalue()]
    _write_atomic(pieces, path)


def _in_write_chunks(table: pa.Table, order: pa.Array | None) -> pa.Table:
    """``table`` in ``order``, in chunks of :data:`WRITE_CHUNK_ROWS` rows."""
    if order is not None:
        table = take_rows(table, order)
    return pa.Table.from_batches(table.to_batches(max_chunksize=WRITE_CHUNK_ROWS), table.schema)


def _write_atomic(pieces: list[Any], path: Path) -> None:
    """Write ``pieces`` in order to ``path`` via a hidden temporary file, fsync and rename."""
    tmp = path.with_name(f"{TEMP_PREFIX}{path.name}.tmp")
    try:
        with open(tmp, "wb") as out:
            for piece in pieces:
                out.write(piece)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a failed write (disk full, ...) leaves nothing behind
        raise
    fsync_path(path.parent)


@dataclass
class _Buffer:
    tables: list[pa.Table] = field(default_factory=list)
    nbytes: int = 0
    since: float = 0.0  # monotonic time of the oldest buffered row


class PartitionedParquetWriter:
    """Buffers span tables per hive partition and writes zstd Parquet files atomically (token lists
    through ``list_splice`` if ``splice_lists``). Thread-safe."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        max_file_bytes: int = 128 * 1024 * 1024,
        max_file_age_s: float = 60.0,
        file_prefix: str | None = None,
        compression_level: int | None = None,
        splice_lists: bool = False,
    ) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_file_bytes = max_file_bytes
        self.max_file_age_s = max_file_age_s
        self.compression_level = compression_level
        self.splice_lists = splice_lists
        self._prefix = file_prefix or f"part-{uuid.uuid4().hex[:12]}"
        self._seq = itertools.count()
        self._buffers: dict[Partition, _Buffer] = {}
        self._lock = threading.RLock()
        self._closed = False
        self.files_written: list[Path] = []
        self.rows_written = 0

    @property
    def file_prefix(self) -> str:
        return self._prefix

    @file_prefix.setter
    def file_prefix(self, prefix: str) -> None:
        """Name later files ``<prefix>-<n>.parquet`` (the collector tags files with their WAL segment)."""
        with self._lock:
            self._prefix = prefix
            self._seq = itertools.count()

    @property
    def buffered_bytes(self) -> int:
        with self._lock:
            return sum(b.nbytes for b in self._buffers.values())

    def write(self, table: pa.Table) -> list[Path]:
        """Buffer ``table`` (spans schema); returns the files this call wrote (full or expired buffers)."""
        self.add(table)
        return self.write_due()

    def add(self, table: pa.Table) -> int:
        """Buffer ``table`` (spans schema) without writing anything (no I/O, so no I/O errors); returns
        the bytes it adds to :attr:`buffered_bytes`."""
        if table.num_rows == 0:
            return 0
        added = 0
        with self._lock:
            if self._closed:
                raise RuntimeError("PartitionedParquetWriter is closed")
            now = time.monotonic()
            for partition, part in _split_by_partition(table):
                buffer = self._buffers.setdefault(partition, _Buffer(since=now))
                buffer.tables.append(part)
                size = part.get_total_buffer_size()  # O(buffers); .nbytes walks every value (~0.3 µs/span)
                buffer.nbytes += size
                added += size
        return added

    def write_due(self) -> list[Path]:
        """Write the partitions whose buffer is full or expired. After a failure (an ``OSError``) every
        buffered row is still buffered, so calling it again retries."""
        with self._lock:
            full = [p for p, b in self._buffers.items() if b.nbytes >= self.max_file_bytes]
            written = [self._write_partition(p) for p in full]
            return written + self.flush_expired()

    def flush_expired(self) -> list[Path]:
        """Write every partition whose oldest buffered row is older than ``max_file_age_s``."""
        with self._lock:
            now = time.monotonic()
            due = [p for p, b in self._buffers.items() if now - b.since >= self.max_file_age_s]
            return [self._write_partition(p) for p in due]

    def flush(self) -> list[Path]:
        """Write everything buffered; on return all rows given to :meth:`write` are on disk."""
        with self._lock:
            return [self._write_partition(p) for p in list(self._buffers)]

    def close(self) -> list[Path]:
        with self._lock:
            written = self.flush()
            self._closed = True
            return written

    def _write_partition(self, partition: Partition) -> Path:
        """Write a partition's buffer to a new file; the buffer is dropped only once the file is in place."""
        buffer = self._buffers[partition]
        table = pa.concat_tables(buffer.tables)
        path = partition_dir(self.root, partition) / f"{self._prefix}-{next(self._seq):06d}.parquet"
        write_parquet_atomic(table, path, self.compression_level, splice_lists=self.splice_lists)
        del self._buffers[partition]
        self.files_written.append(path)
        self.rows_written += table.num_rows
        return path

    def __enter__(self) -> PartitionedParquetWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _split_by_partition(table: pa.Table) -> list[tuple[Partition, pa.Table]]:
    received = table.column("received_at").combine_chunks().cast(pa.int64()).to_numpy()
    hours = received // 3_600_000_000_000
    first = int(hours[0])
    if (hours == first).all():  # the usual case: one request, one receive time
        return [(partition_of_ns(first * 3_600_000_000_000), table)]
    parts = []
    for hour in np.unique(hours):
        indices = np.flatnonzero(hours == hour)
        parts.append((partition_of_ns(int(hour) * 3_600_000_000_000), take_rows(table, pa.array(indices))))
    return parts
