"""Incremental builds over a growing spans folder: each poll builds only new, complete rollouts.

The collector writes immutable Parquet files (temp name + rename). :class:`SpanTail` remembers
which rollout ids each file holds. A poll builds trajectories from the new files plus the files
still holding an unresolved rollout (one whose spans are not all there yet, e.g. its root span
lands in a later file), excluding every rollout already resolved. A file whose rollouts are all
resolved is never read again, so the work per poll follows the new data, not the folder size.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tinkertrace import schemas
from tinkertrace.builder import BuildSettings, build_trajectories
from tinkertrace.spanstore.reader import check_file, list_span_files


@dataclass
class TailPoll:
    """What one poll found: the new complete rollouts' trajectory rows and counts."""

    trajectories: pa.Table
    new_files: int = 0
    files_read: int = 0
    rollouts_built: int = 0
    rollouts_incomplete: int = 0
    skipped_files: list[str] = field(default_factory=list)
    built_at: float = field(default_factory=time.time)  # wall clock when the poll finished
    files: tuple[Path, ...] = ()  # the span files it read: every span of the rollouts it built is in them


@dataclass
class SpanTail:
    """Follows ``spans_dir``; :meth:`poll` returns trajectories of rollouts not seen before.

    ``resolved`` holds rollout ids that must never be built again (trained, dropped, or built and
    waiting); seed it with the ids recorded in earlier checkpoints when resuming.
    ``give_up_s``: a file whose rollouts stay incomplete this long stops being re-read.
    """

    spans_dir: Path
    resolved: set[str] = field(default_factory=set)
    group_by: str = "task"
    give_up_s: float = 600.0
    _seen: set[Path] = field(default_factory=set)
    _pending: dict[Path, tuple[frozenset[str], float]] = field(default_factory=dict)

    @staticmethod
    def _rollouts_by_file(files: list[Path]) -> dict[Path, frozenset[str]]:
        """The rollout ids each file holds (its ``rollout_id`` column alone is read)."""
        out: dict[Path, frozenset[str]] = {}
        for path in files:
            if "rollout_id" not in pq.read_schema(path).names:
                out[path] = frozenset()
                continue
            ids = pc.unique(pq.read_table(path, columns=["rollout_id"])["rollout_id"]).drop_null()
            out[path] = frozenset(ids.to_pylist())
        return out

    def poll(self) -> TailPoll:
        """Build the rollouts that became complete since the last poll."""
        new, skipped = [], []
        for path in list_span_files(self.spans_dir):
            if path in self._seen:
                continue
            self._seen.add(path)
            problem = check_file(path)
            if problem is None:
                new.append(path)
            else:
                skipped.append(f"{path}: {problem}")
        now = time.monotonic()
        if new:
            for path, ids in self._rollouts_by_file(new).items():
                self._pending[path] = (ids, now)
        self._pending = {
            p: (ids, t)
            for p, (ids, t) in self._pending.items()
            if not ids <= self.resolved and now - t < self.give_up_s
        }
        empty = schemas.trajectories().empty_table()
        if not new or not self._pending:
            return TailPoll(empty, new_files=len(new), skipped_files=skipped)
        files = tuple(sorted(self._pending))
        options = BuildSettings(
            files=files,
            exclude_rollouts=frozenset(self.resolved),
            group_by=self.group_by,  # type: ignore[arg-type]
        )
        result = build_trajectories(self.spans_dir, None, options)
        built = set(result.summary.rollout_ids)
        self.resolved |= built
        return TailPoll(
            result.trajectories,
            new_files=len(new),
            files_read=len(files),
            rollouts_built=len(built),
            rollouts_incomplete=len(result.summary.incomplete_rollout_ids),
            skipped_files=skipped + [f"{p}: {why}" for p, why in result.summary.corrupt_files],
            files=files,
        )


class BackgroundTail:
    """Polls a :class:`SpanTail` on its own thread, so building new rollouts overlaps training.

    Without it, a trainer polls only between steps and a rollout that lands during a step waits for
    the step, the checkpoint and the publish before it is even built. Use as a context manager;
    :meth:`take` returns every poll that found something since the last call (re-raising an error
    the poller hit), :meth:`wait` sleeps until the next such poll or ``timeout``.
    """

    def __init__(self, tail: SpanTail, poll_s: float) -> None:
        self.tail = tail
        self.poll_s = poll_s
        self._ready: list[TailPoll] = []
        self._error: BaseException | None = None
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tt-follow-tail", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                polled = self.tail.poll()
            except BaseException as exc:  # handed to the trainer's thread by take()
                with self._changed:
                    self._error = exc
                    self._changed.notify_all()
                return
            # a poll that built rollouts without rows (no token ids) is handed over too: they are counted
            if polled.trajectories.num_rows or polled.skipped_files or polled.rollouts_built:
                with self._changed:
                    self._ready.append(polled)
                    self._changed.notify_all()
            self._stop.wait(max(0.0, self.poll_s - (time.monotonic() - started)))  # start to start

    def take(self) -> list[TailPoll]:
        with self._changed:
            if self._error is not None:
                raise self._error
            ready, self._ready = self._ready, []
            return ready

    def wait(self, timeout: float) -> None:
        with self._changed:
            if not self._ready and self._error is None:
                self._changed.wait(timeout)

    def __enter__(self) -> BackgroundTail:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
