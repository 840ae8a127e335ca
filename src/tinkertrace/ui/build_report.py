"""The build report page's data: a full build of the run's spans (the builder's own summary), on a
background thread, kept per reward policy until the run's files change."""

from __future__ import annotations

import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tinkertrace.builder import BuildSettings, BuildSummary, build_trajectories
from tinkertrace.ui.index import RunIndex

LISTED = 200  # rollouts listed per problem (the counts are complete)


@dataclass
class BuildReport:
    """One full build: per spans folder its summary, or why it failed; ``version`` of the data it saw."""

    version: int
    policy: str
    started: float = field(default_factory=time.time)
    finished: float | None = None
    summaries: list[tuple[Path, BuildSummary]] = field(default_factory=list)
    error: str | None = None

    @property
    def running(self) -> bool:
        return self.finished is None

    def rows(self) -> list[tuple[str, str]]:
        """The summary's (label, count) rows, summed over the span folders."""
        if len(self.summaries) == 1:
            return self.summaries[0][1].rows()
        merged: dict[str, list[str]] = {}
        for _, summary in self.summaries:
            for label, value in summary.rows():
                merged.setdefault(label, []).append(value)
        return [(label, " + ".join(values)) for label, values in merged.items()]

    def unmatched_rewards(self) -> list[tuple[str, str]]:
        return [pair for _, s in self.summaries for pair in s.unmatched_rewards]

    def incomplete_rollouts(self) -> list[str]:
        return [rid for _, s in self.summaries for rid in s.incomplete_rollout_ids]

    def corrupt_files(self) -> list[tuple[Path, str]]:
        return [pair for _, s in self.summaries for pair in s.corrupt_files]


class BuildReports:
    """Starts a build when a policy's report is missing or older than the data, one build at a time."""

    def __init__(self, index: RunIndex) -> None:
        self.index = index
        self._done: dict[str, BuildReport] = {}
        self._running: BuildReport | None = None
        self._lock = threading.Lock()

    def get(self, policy: str, group_by: str = "task") -> tuple[BuildReport | None, BuildReport | None]:
        """(newest finished report for ``policy``, the build running now if it is for ``policy``);
        starts a build (grouping by ``group_by``) when the finished one is missing or older than the
        data."""
        with self._lock:
            done = self._done.get(policy)
            stale = done is None or done.version != self.index.version
            if stale and self._running is None:
                self._running = BuildReport(self.index.version, policy)
                # not a daemon: the interpreter waits for a build before finalizing, as a daemon thread
                # still inside DuckDB at finalization would abort the process
                threading.Thread(
                    target=self._run, args=(self._running, group_by), name="ui-build-report", daemon=False
                ).start()
            running = self._running if self._running is not None and self._running.policy == policy else None
            return done, running

    def _run(self, report: BuildReport, group_by: str) -> None:
        try:
            for spans_dir in list(self.index.sources.spans_dirs):
                with tempfile.TemporaryDirectory(prefix="tinkertrace-ui-build-") as tmp:
                    options = BuildSettings(reward_policy=report.policy, group_by=group_by)  # type: ignore[arg-type]
                    result = build_trajectories(spans_dir, Path(tmp), options)
                    report.summaries.append((spans_dir, result.summary))
        except Exception as exc:  # shown on the page; the app keeps serving
            report.error = f"{exc.__class__.__name__}: {exc}"
        report.finished = time.time()
        with self._lock:
            self._done[report.policy] = report
            self._running = None

    def problem_lists(self) -> dict[str, Any]:
        """(count, first ``LISTED`` rollouts) with re-tokenised calls and with calls without token ids."""
        cur = self.index.cursor()

        def rollouts(where: str) -> tuple[int, list[dict[str, Any]]]:
            total = cur.execute(f"SELECT count(*) FROM rollouts WHERE {where}").fetchone()[0]  # type: ignore[index]
            rows = cur.execute(
                f"SELECT rollout_id, task_id, retokenized_calls, calls_without_ids, incomplete FROM rollouts "
                f"WHERE {where} ORDER BY start_ms DESC LIMIT {LISTED}"
            ).fetchall()
            names = ("rollout_id", "task_id", "retokenized_calls", "calls_without_ids", "incomplete")
            return int(total), [dict(zip(names, r, strict=True)) for r in rows]

        return {
            "retokenized": rollouts("retokenized_calls > 0"),
            "without_ids": rollouts("calls_without_ids > 0"),
        }
