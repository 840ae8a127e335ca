"""The collector's memory budget: one count of the bytes requests hold, against one limit."""

from __future__ import annotations

import threading

# A request holds its body, then its body and its converted table (about the body's size for protobuf,
# smaller for JSON) until the WAL has it: admission reserves this many times the declared size.
ADMIT_FACTOR = 2
# Writing a Parquet file takes working memory of up to ~2.5x the file's buffered table data (the sorted copy
# of the columns, the token lists gathered in file order, the compressed pages; peak RSS grew 2.5x and 2.1x
# the data while writing files of 43 and 128 MB of LLM spans). The budget keeps that much aside for the
# writer, so the working memory of a write is inside the budget.
WRITE_FACTOR = 2.5
# files are written once buffered tables reach this share of the budget (or --max-file-mb if smaller): the
# budget then holds requests in flight, one file's tables and that file's working memory (1/8 + 2.5/8)
FILE_SHARE = 8


class MemoryBudget:
    """One count of the bytes that requests hold in the collector, against one limit: bodies being
    received (reserved at ``ADMIT_FACTOR`` x their declared size when admitted), bodies and converted
    tables waiting for the WAL, and tables until their Parquet file is written. ``write_reserve`` bytes of
    the limit are kept aside for writing a file; requests are admitted up to the rest. Thread-safe."""

    def __init__(self, limit: int, write_reserve: int = 0) -> None:
        self.limit = limit
        self.write_reserve = min(write_reserve, limit)
        self.admission_limit = limit - self.write_reserve
        self.used = 0
        self._lock = threading.Lock()

    def try_reserve(self, nbytes: int) -> bool:
        """Take ``nbytes`` unless that would pass the admission limit (a request larger than it is let
        in when nothing else is held, so it is not refused for ever)."""
        with self._lock:
            if self.used and self.used + nbytes > self.admission_limit:
                return False
            self.used += nbytes
            return True

    def reserve(self, nbytes: int) -> None:
        """Take ``nbytes`` regardless of the limit (work already admitted; negative gives back)."""
        with self._lock:
            self.used += nbytes

    def release(self, nbytes: int) -> None:
        with self._lock:
            self.used -= nbytes

    @property
    def full(self) -> bool:
        return self.used >= self.admission_limit
