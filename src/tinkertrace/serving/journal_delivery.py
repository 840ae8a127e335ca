"""The journal's parts around its log: what a handler waits on, the journal's counts, and the delivery
thread that hands logged span records to the targets (:mod:`.journal_targets`) in log order and deletes
a segment once all its spans arrived."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import queue
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tinkertrace.collector.ingest import name_os_thread
from tinkertrace.collector.wal import WriteAheadLog
from tinkertrace.sdk.export import encode_batch
from tinkertrace.sdk.stats import ExportStats
from tinkertrace.serving.journal_targets import Target

log = logging.getLogger("tinkertrace.serving")

STOP = object()
"""Put on a queue: the thread reading it ends."""


@dataclass
class JournalStats(ExportStats):
    """The export counts plus the journal's."""

    journal_commits: int = 0  # group commits: one fsync each
    spans_logged: int = 0  # made durable in the journal
    spans_delivered: int = 0  # handed to the targets (Parquet, collector) after logging
    spans_replayed: int = 0  # handed to the targets again at a start, from what a previous run left
    journal_errors: int = 0  # commits that failed (their calls answered 503)
    delivery_errors: int = 0  # deliveries that failed (their segments kept, to be replayed)


class JournalUnavailable(Exception):
    """The record could not be made durable (the disk refused it, or the journal is closed)."""


@dataclass
class Item:
    kind: str  # "span" | "rollout" | "flush"
    value: Any
    future: Future[None] = field(default_factory=Future)
    queued: float = field(default_factory=time.perf_counter)


@dataclass
class Durable:
    """The records ended inside one :meth:`Journal.capture`."""

    futures: list[Future[None]] = field(default_factory=list)

    async def wait(self) -> None:
        """Return once every record is durable; :class:`JournalUnavailable` if one could not be."""
        for future in self.futures:
            await asyncio.wrap_future(future)


def settle(future: Future[None], error: Exception | None = None) -> None:
    """Resolve ``future`` unless it is settled already (a waiter that went away cancels it)."""
    with contextlib.suppress(InvalidStateError):
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


def lock_folder(folder: Path) -> int:
    """An exclusive lock on ``folder`` for this process (released when it exits, however it exits)."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RuntimeError(
            f"the journal {folder} is in use by another endpoint recording to the same place: give each "
            "endpoint its own --journal-dir"
        ) from None
    return fd


class Delivery:
    """The delivery thread's work: messages ``("begin", segment)``, ``("spans", payload, logged_at_ns,
    n_spans)``, ``("calls", spans, logged_at_ns)``, ``("end" | "end_keep", segment)``, an :class:`Item`
    (a flush, settled when reached) and :data:`STOP`."""

    def __init__(self, targets: list[Target], wal: WriteAheadLog, stats: JournalStats) -> None:
        self.targets, self.wal, self.stats = targets, wal, stats
        self._queue: queue.Queue[Any] = queue.Queue()

    def put(self, message: Any) -> None:
        self._queue.put(message)

    def run(self) -> None:
        """Hand span records to the targets in log order; delete a segment once all its spans arrived. A
        failure keeps the segment (the next start replays it) and is counted."""
        name_os_thread()
        failed: set[int] = set()
        segment = 0
        while True:
            message = self._queue.get()
            if message is STOP:
                return
            if isinstance(message, Item):  # a flush: everything before it was delivered
                settle(message.future)
                continue
            kind, value, *rest = message
            try:
                if kind == "begin":
                    segment = value
                    for target in self.targets:
                        target.begin(value)
                elif kind == "spans":
                    self._deliver(value, rest[0], rest[1])
                elif kind == "calls":  # their spans are built here, after the answers left
                    request = encode_batch(value, self.stats)
                    if request is None:  # logged by encode_batch; the segment is kept, not deleted
                        raise RuntimeError(f"{len(value)} calls' spans could not be encoded")
                    self._deliver(request.SerializeToString(), rest[0], len(value))
                elif kind in ("end", "end_keep"):
                    for target in self.targets:
                        target.end(value)
                    if kind == "end" and value not in failed:
                        self.wal.delete(value)
            except Exception:
                log.exception("tinkertrace journal: delivering segment %d failed; kept to replay", segment)
                self.stats.add("delivery_errors")
                failed.add(segment)

    def _deliver(self, payload: bytes, logged_at_ns: int, n_spans: int) -> None:
        for target in self.targets:
            target.deliver(payload, logged_at_ns)
        self.stats.add("spans_delivered", n_spans)
