"""A folder of OTLP request payloads that could not be delivered yet, oldest first.

Each file is one serialized ``ExportTraceServiceRequest`` named ``<time_ns>-<seq>-n<spans>.otlp``,
written under a temporary name and renamed, so a crash never leaves a half file that looks whole.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from pathlib import Path

SUFFIX = ".otlp"


class Spool:
    """Put payloads, list them oldest first, read and remove them."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "rejected").mkdir(exist_ok=True)
        self._seq = itertools.count()
        self._lock = threading.Lock()

    def put(self, payload: bytes, n_spans: int) -> Path:
        with self._lock:
            name = f"{time.time_ns():020d}-{os.getpid()}-{next(self._seq):06d}-n{n_spans}{SUFFIX}"
        final = self.root / name
        tmp = final.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.rename(final)
        return final

    def pending(self) -> list[Path]:
        return sorted(self.root.glob("*" + SUFFIX))

    @staticmethod
    def span_count(path: Path) -> int:
        try:
            return int(path.stem.rsplit("-n", 1)[1])
        except (IndexError, ValueError):
            return 0

    def reject(self, path: Path) -> None:
        """Keep a payload the endpoint refused as invalid aside for inspection (never re-sent)."""
        path.rename(self.root / "rejected" / path.name)
