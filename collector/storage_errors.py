"""Storage errors the collector retries (too many open files, disk full, ...), and what /health says.

An ``OSError`` from the WAL or the Parquet writer is not fatal: the step is retried with backoff
and the collector reports ``recovering`` until the part (``WAL``, ``WRITER``) works again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger("tinkertrace.collector")

_T = TypeVar("_T")

RETRY_FIRST_S, RETRY_MAX_S = 0.05, 2.0  # backoff between retries of a failed storage step


class StorageTroubles:
    """The storage errors being retried now, by part; counts go into the collector's ``stats``."""

    def __init__(self, stats: dict[str, Any]) -> None:
        self.now: dict[str, str] = {}  # part -> its current error
        self.last: str | None = None  # the latest error, with its time (kept after it clears)
        self._stats = stats
        stats.setdefault("storage_errors", 0)
        stats.setdefault("storage_recoveries", 0)

    def __bool__(self) -> bool:
        return bool(self.now)

    def hit(self, part: str, exc: OSError) -> None:
        """Record a storage error of ``part`` (it is being retried)."""
        message = f"{part}: {exc!r}"
        if part not in self.now:
            log.warning("%s; retrying", message)
            self._stats["storage_errors"] += 1
        self.now[part] = message
        self.last = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {message}"

    def cleared(self, part: str) -> None:
        """``part`` worked: it is no longer in trouble."""
        if self.now.pop(part, None) is not None:
            log.warning("%s works again", part)
            self._stats["storage_recoveries"] += 1

    def retrying(self, part: str, step: Callable[[], _T], stopping: Callable[[], bool]) -> _T:
        """``step()``, repeated with backoff while it raises ``OSError``; once ``stopping()`` and the
        backoff is at its longest, the error is raised."""
        backoff = RETRY_FIRST_S
        while True:
            try:
                result = step()
            except OSError as exc:
                self.hit(part, exc)
                if stopping() and backoff >= RETRY_MAX_S:
                    raise
                time.sleep(backoff)
                backoff = min(backoff * 2, RETRY_MAX_S)
                continue
            self.cleared(part)
            return result
