"""Atomic, deterministic Parquet output: fixed-size row groups, temp name + fsync + rename.

Row groups are encoded and compressed on a background thread (Arrow releases the GIL), so writing
overlaps with producing the next rows; the file's bytes are the same as a synchronous write's.
"""

from __future__ import annotations

import os
import queue
import threading
from pathlib import Path
from types import TracebackType

import pyarrow as pa
import pyarrow.parquet as pq

ROW_GROUP_ROWS = 4096
# Row groups waiting for the writer thread at most (bounds the memory the overlap costs).
QUEUE_GROUPS = 1


class AtomicParquetWriter:
    """Writes ``path`` via ``.path.tmp``; the final name appears only on :meth:`commit`.

    Rows are re-chunked into row groups of exactly ``row_group_rows`` (the last one shorter), so
    the same rows give the same file whatever batch sizes they arrived in.
    """

    def __init__(self, path: Path, schema: pa.Schema, row_group_rows: int = ROW_GROUP_ROWS) -> None:
        self.path = Path(path)
        self.schema = schema
        self.rows = 0
        self._tmp = self.path.with_name(f".{self.path.name}.tmp")
        # Dictionary encoding and statistics only on flat columns: token lists are high-cardinality
        # and dictionary-encoding them costs more than the whole rest of the write.
        flat = [f.name for f in schema if not pa.types.is_list(f.type)]
        self._writer = pq.ParquetWriter(
            self._tmp,
            schema,
            compression="zstd",
            compression_level=1,
            use_dictionary=flat,
            write_statistics=flat,
        )
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._group = row_group_rows
        self._queue: queue.Queue[pa.Table | None] = queue.Queue(QUEUE_GROUPS)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._drain, name=f"parquet-{self.path.name}", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        """Writer thread: write queued row groups in order until ``None``; keep the first error."""
        while (table := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._writer.write_table(table)
                except BaseException as exc:  # re-raised in the producer by _check
                    self._error = exc

    def _check(self) -> None:
        if self._error is not None:
            raise self._error

    def _put(self, table: pa.Table) -> None:
        self._check()
        self._queue.put(table)

    def _finish(self) -> None:
        """Stop the writer thread after the queued row groups are written."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def write(self, table: pa.Table) -> None:
        table = table.cast(self.schema)
        self._pending.append(table)
        self._pending_rows += table.num_rows
        self.rows += table.num_rows
        if self._pending_rows >= self._group:
            data = pa.concat_tables(self._pending)
            cut = (data.num_rows // self._group) * self._group
            # one chunk per row group: the pages then do not depend on how the rows arrived
            for start in range(0, cut, self._group):
                self._put(data.slice(start, self._group).combine_chunks())
            rest = data.slice(cut)
            self._pending, self._pending_rows = [rest], rest.num_rows

    def commit(self) -> Path:
        if self._pending_rows or self.rows == 0:
            rest = pa.concat_tables(self._pending) if self._pending else self.schema.empty_table()
            self._put(rest.combine_chunks())
        self._finish()
        self._check()
        self._writer.close()
        with open(self._tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(self._tmp, self.path)
        return self.path

    def abort(self) -> None:
        self._finish()
        self._writer.close()
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> AtomicParquetWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None:
            self.abort()
