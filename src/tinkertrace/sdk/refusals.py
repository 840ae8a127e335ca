"""Endpoints (host and path: one API of one server) that refused the token-id fields the SDK adds,
each mark re-checked later.

An endpoint is marked only on evidence that the added fields themselves were refused: the extended
request got a 400 and the agent's own body, sent again, did not. A genuine 400 (context length, a bad
message) fails both ways and marks nothing. A mark lapses after ``recheck_calls`` unextended calls
or ``recheck_s`` seconds, whichever comes first, and the next call asks again (a server restarted
with the extension, a proxy fixed, a transient refusal).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass
class _Mark:
    until: float  # time.monotonic() when the mark lapses
    calls_left: int  # unextended calls before it lapses


class RefusedEndpoints:
    """``skip(endpoint)`` per call: whether to leave the request as the agent wrote it."""

    def __init__(self, recheck_calls: int, recheck_s: float) -> None:
        self._recheck_calls = recheck_calls
        self._recheck_s = recheck_s
        self._marks: dict[str, _Mark] = {}
        self._lock = threading.Lock()

    def mark(self, endpoint: str) -> None:
        with self._lock:
            self._marks[endpoint] = _Mark(time.monotonic() + self._recheck_s, self._recheck_calls)

    def skip(self, endpoint: str) -> bool:
        """True while ``endpoint`` is marked (counts the call); False once the mark has lapsed."""
        if not self._marks:  # the common case: no lock
            return False
        with self._lock:
            mark = self._marks.get(endpoint)
            if mark is None:
                return False
            if mark.calls_left <= 0 or time.monotonic() >= mark.until:
                del self._marks[endpoint]
                return False
            mark.calls_left -= 1
            return True

    def marked(self) -> list[str]:
        with self._lock:
            return sorted(self._marks)
