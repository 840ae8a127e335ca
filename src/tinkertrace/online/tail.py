"""Incremental builds over a growing spans folder: each poll builds only new, complete rollouts.

The collector writes immutable Parquet files (temp name + rename). :class:`SpanTail` remembers
which rollout ids each file holds. A poll builds trajectories from the new files plus the files
still holding an unresolved rollout (one whose spans are not all there yet, e.g. its root span
lands in a later file), excluding every rollout already resolved. A file whose rollouts are all
resolved is never read again, so the work per poll follows the new data, not the folder size.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa

from tinkertrace import schemas
from tinkertrace.builder import BuildOptions, build_trajectories
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

    def _rollouts_by_file(self, files: list[Path]) -> dict[Path, frozenset[str]]:
        out: dict[Path, frozenset[str]] = {f: frozenset() for f in files}
        con = duckdb.connect()
        try:
            rows = con.execute(
                "SELECT filename, list(DISTINCT rollout_id) FROM read_parquet($files, filename = true, "
                "union_by_name = true) WHERE rollout_id IS NOT NULL GROUP BY filename",
                {"files": [str(f) for f in files]},
            ).fetchall()
        finally:
            con.close()
        for name, ids in rows:
            out[Path(name)] = frozenset(ids)
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
        options = BuildOptions(
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
        )
