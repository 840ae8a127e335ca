"""A token-free index of a run's spans in DuckDB, kept current as files arrive, and the rollout list.

Each span file is read once: one small row per span (ids, type, times, reward, token counts, the
root's JSON) goes into the in-memory table ``span_index``; files that disappear (compaction) take
their rows with them. The ``rollouts`` table (one row per rollout) is rebuilt from it after every
change with the builder's own relations (:mod:`tinkertrace.ui.rollout_table`), so list pages are
paged ``ORDER BY ... LIMIT`` queries over ~100 bytes per rollout, never a scan of the span files.
The builder stays the judge of what a trainer sees: the rollout and trajectory pages and the build
report build with :mod:`tinkertrace.builder`.
"""

from __future__ import annotations

import io
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.csv as pacsv

from tinkertrace.spanstore.compact import superseded_inputs
from tinkertrace.spanstore.reader import check_file
from tinkertrace.spanstore.sql import literal_list
from tinkertrace.ui import outcomes, rollout_table
from tinkertrace.ui.listing import LIST_COLUMNS, STATUSES, RolloutPage, RolloutQuery
from tinkertrace.ui.sources import RunSources, discover, span_files


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except OSError:
        return None


def _dicts(cursor: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


class RunIndex:
    """The run's span index and rollout table; :meth:`refresh` picks up new and removed files."""

    def __init__(
        self, paths: Sequence[Path], *, refresh_s: float = 1.0, memory_limit: str = "1GB", threads: int = 0
    ) -> None:
        self.paths = [Path(p) for p in paths]
        self.refresh_s = refresh_s
        config: dict[str, Any] = {"memory_limit": memory_limit}
        self.con = duckdb.connect(config=config)
        self.con.execute("SET enable_progress_bar = false")
        if threads:
            self.con.execute(f"SET threads = {int(threads)}")
        rollout_table.create_index(self.con)
        outcomes.load(self.con, [])
        rollout_table.rebuild(self.con)
        self.sources = RunSources(roots=self.paths)
        self.indexed: set[Path] = set()
        self.skipped: dict[Path, str] = {}  # unreadable files and why
        self.version = 0  # bumped whenever the data shown may have changed
        self.refreshed_at = 0.0
        self._record_marks: tuple[Any, ...] = ()
        self._settings_marks: tuple[Any, ...] = ()
        self._lock = threading.Lock()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor for one request (DuckDB cursors of one connection may run on several threads)."""
        return self.con.cursor()

    # --- keeping current -----------------------------------------------------------------------------
    def refresh(self, force: bool = False) -> bool:
        """Look for new, removed and changed files (at most every ``refresh_s``); True when data changed."""
        with self._lock:
            if not force and time.monotonic() - self.refreshed_at < self.refresh_s:
                return False
            self.sources = discover(self.paths)
            changed = self._sync_spans() | self._sync_outcomes()
            if changed:
                rollout_table.rebuild(self.con)
            settings = self._file_marks([*self.sources.summary_files, *self.sources.config_files()])
            if changed or settings != self._settings_marks:  # a new summary or config shows live too
                self._settings_marks = settings
                self.version += 1
            self.refreshed_at = time.monotonic()
            return changed

    def _sync_spans(self) -> bool:
        hidden = {p for d in self.sources.spans_dirs for p in superseded_inputs(d)}
        present = {p for p in span_files(self.sources) if p not in hidden}
        gone = (self.indexed | set(self.skipped)) - present
        new = [p for p in sorted(present - self.indexed) if p not in self.skipped]
        for path in gone:
            self.skipped.pop(path, None)
        good = []
        for path in new:
            problem = check_file(path)
            if problem is None:
                good.append(path)
            else:
                self.skipped[path] = problem
        if gone & self.indexed:
            names = literal_list(gone & self.indexed)
            self.con.execute(f"DELETE FROM span_index WHERE filename IN ({names})")
        if good:
            rollout_table.ingest(self.con, good)
        self.indexed = (self.indexed - gone) | set(good)
        return bool(good or (gone & self.indexed) or gone)

    def _sync_outcomes(self) -> bool:
        """What training did with each rollout (the trainer's records in the run's log folders)."""
        files = outcomes.record_files(self.sources.log_dirs)
        marks = self._file_marks(files)
        if marks == self._record_marks:
            return False
        self._record_marks = marks
        outcomes.load(self.con, files)
        return True

    @staticmethod
    def _file_marks(files: Sequence[Path]) -> tuple[Any, ...]:
        """What tells a file changed: its path, modification time and size (of those that exist)."""
        return tuple((p, s.st_mtime_ns, s.st_size) for p in files if (s := _stat(p)) is not None)

    # --- reading -------------------------------------------------------------------------------------
    def counts(self) -> dict[str, Any]:
        """Headline figures of the run (and the data version, for live pages)."""
        cur = self.cursor()
        spans, files = cur.execute(  # type: ignore[misc]
            "SELECT count(*), count(DISTINCT filename) FROM span_index"
        ).fetchone()
        row = cur.execute(
            "SELECT count(*), count(*) FILTER (WHERE outcome = 'trained'), "
            "count(*) FILTER (WHERE incomplete IS NOT NULL), avg(reward), sum(turns), sum(tokens), "
            f"count(*) FILTER (WHERE {outcomes.IS_DROPPED}) "
            "FROM rollouts"
        ).fetchone()
        assert row is not None
        rollouts, trained, incomplete, mean_reward, calls, tokens, dropped = row
        return {
            "version": self.version,
            "spans": spans,
            "files": files,
            "files_skipped": len(self.skipped),
            "rollouts": rollouts,
            "rollouts_trained": trained,
            "rollouts_incomplete": incomplete,
            "rollouts_dropped": dropped,
            "trained_fraction": trained / rollouts if rollouts else None,
            "mean_reward": mean_reward,
            "llm_calls": int(calls or 0),
            "tokens_sampled": int(tokens or 0),
        }

    def list_rollouts(self, query: RolloutQuery) -> RolloutPage:
        """One sorted, filtered page of the rollout list."""
        where, params = query.where()
        cur = self.cursor()
        total = cur.execute(f"SELECT count(*) FROM rollouts WHERE {where}", params).fetchone()[0]  # type: ignore[index]
        sql, params = query.select()
        cur.execute(f"{sql} LIMIT ? OFFSET ?", [*params, query.per_page, (query.page - 1) * query.per_page])
        return RolloutPage(_dicts(cur), int(total), query)

    def export(self, query: RolloutQuery, fmt: str) -> str:
        """Every row the list's filters match (all pages, its order) as CSV or JSON lines."""
        sql, params = query.select()
        cur = self.cursor()
        if fmt == "jsonl":
            rows = cur.execute(f"SELECT to_json(r)::VARCHAR FROM ({sql}) r", params).fetchall()
            return "".join(row[0] + "\n" for row in rows)
        buffer = io.BytesIO()
        pacsv.write_csv(cur.sql(sql, params=params).to_arrow_table(), buffer)
        return buffer.getvalue().decode()

    def by_version(self, environments: Sequence[str] = ()) -> list[dict[str, Any]]:
        """Reward by policy version (and by environment, when the run names ``environments``: a task
        id's environment is the part before its first ``/``, as training groups them): rollouts, how
        many were trained, mean and quartiles of the reward."""
        env = "NULL"
        if environments:
            prefix = "split_part(task_id, '/', 1)"
            env = f"CASE WHEN {prefix} IN ({literal_list(environments)}) THEN {prefix} END"
        cur = self.cursor().execute(
            f"""
            SELECT policy_version, {env} AS environment, count(*) AS rollouts,
                   count(*) FILTER (WHERE outcome = 'trained') AS trained, count(reward) AS rewarded,
                   avg(reward) AS mean, min(reward) AS min,
                   quantile_cont(reward, 0.25) AS q1, median(reward) AS median,
                   quantile_cont(reward, 0.75) AS q3, max(reward) AS max
            FROM rollouts GROUP BY ALL ORDER BY policy_version NULLS FIRST, environment NULLS LAST
            """
        )
        return _dicts(cur)

    def task_progress(self, limit: int = 20) -> list[dict[str, Any]]:
        """The tasks sampled under more than one policy version whose mean reward moved most from their
        first version to their last (which tasks got better or worse)."""
        cur = self.cursor().execute(
            """
            WITH v AS (
                SELECT task_id, policy_version, avg(reward) AS mean, count(*) AS n FROM rollouts
                WHERE task_id IS NOT NULL AND policy_version IS NOT NULL AND reward IS NOT NULL GROUP BY ALL
            ), t AS (
                SELECT task_id,
                       min(policy_version) AS first_version, arg_min(mean, policy_version) AS first_mean,
                       max(policy_version) AS last_version, arg_max(mean, policy_version) AS last_mean,
                       sum(n) AS rollouts
                FROM v GROUP BY task_id HAVING count(*) > 1
            )
            SELECT *, last_mean - first_mean AS change FROM t ORDER BY abs(change) DESC, task_id LIMIT ?
            """,
            [limit],
        )
        return _dicts(cur)

    def facets(self) -> dict[str, list[str]]:
        """Values offered in the list's filter menus (statuses, splits; agents when few)."""
        cur = self.cursor()
        splits = [
            r[0]
            for r in cur.execute(
                "SELECT DISTINCT split FROM rollouts WHERE split IS NOT NULL ORDER BY 1"
            ).fetchall()
        ]
        agents = cur.execute(
            "SELECT DISTINCT agent_name FROM span_index WHERE agent_name IS NOT NULL ORDER BY 1 LIMIT 51"
        ).fetchall()
        return {"statuses": list(STATUSES), "splits": splits, "agents": [a[0] for a in agents][:50]}

    def rollout(self, rollout_id: str) -> dict[str, Any] | None:
        """The list row of one rollout (with its counts), or None."""
        cur = self.cursor().execute(
            "SELECT * EXCLUDE (haystack) FROM rollouts WHERE rollout_id = ?", [rollout_id]
        )
        rows = _dicts(cur)
        return rows[0] if rows else None

    def spans_of(self, rollout_id: str) -> list[dict[str, Any]]:
        """The rollout's spans (index rows, with the rollout id inherited from the trace), by start time."""
        cur = self.cursor().execute(
            """
            WITH traces AS (SELECT trace_id FROM trace_rollouts WHERE rollout_id = $r)
            SELECT *, start_ns // 1000 AS start_us, end_ns // 1000 AS end_us FROM (
                SELECT * FROM span_index WHERE trace_id IN (SELECT trace_id FROM traces)
                QUALIFY row_number() OVER (PARTITION BY trace_id, span_id ORDER BY received_ns, filename) = 1
            ) WHERE COALESCE(rollout_id, $r) = $r ORDER BY start_ns, end_ns DESC, span_id
            """,
            {"r": rollout_id},
        )
        return _dicts(cur)

    def files_of(self, rollout_ids: Sequence[str]) -> list[Path]:
        """The span files holding any span of these rollouts' traces."""
        if not rollout_ids:
            return []
        cur = self.cursor().execute(
            "SELECT DISTINCT filename FROM span_index WHERE trace_id IN "
            "(SELECT trace_id FROM trace_rollouts WHERE rollout_id IN (SELECT unnest($ids))) ORDER BY 1",
            {"ids": list(rollout_ids)},
        )
        return [Path(r[0]) for r in cur.fetchall()]

    def group_rows(self, task_id: str | None, rollout_id: str) -> list[dict[str, Any]]:
        """The list rows of the rollouts sharing ``rollout_id``'s task (its GRPO group), by attempt."""
        column, value = ("task_id", task_id) if task_id is not None else ("rollout_id", rollout_id)
        cur = self.cursor().execute(
            f"SELECT {', '.join(LIST_COLUMNS)} FROM rollouts WHERE {column} = ? "
            "ORDER BY attempt NULLS LAST, start_ms, rollout_id",
            [value],
        )
        return _dicts(cur)

    def rollouts_of_task(self, task_id: str | None, rollout_id: str) -> list[str]:
        """The rollouts sharing ``rollout_id``'s task (its GRPO group), or just it when it has no task."""
        if task_id is None:
            return [rollout_id]
        rows = (
            self.cursor().execute("SELECT rollout_id FROM rollouts WHERE task_id = ?", [task_id]).fetchall()
        )
        return [r[0] for r in rows]

    def span_details(self, rollout_id: str, files: Sequence[Path]) -> dict[str, dict[str, Any]]:
        """span_id -> the JSON columns (attributes, events) of the rollout's spans, read from its files."""
        if not files:
            return {}
        listing = f"[{literal_list(files)}]"
        cur = self.cursor().execute(
            f"""
            WITH traces AS (SELECT trace_id FROM trace_rollouts WHERE rollout_id = $r)
            SELECT span_id, attributes, events FROM read_parquet({listing}, union_by_name = true)
            WHERE trace_id IN (SELECT trace_id FROM traces)
            """,
            {"r": rollout_id},
        )
        return {row["span_id"]: row for row in _dicts(cur)}

    def missing_spans(self) -> str | None:
        """'no span files found in …' when no span file could be read (None once one is indexed)."""
        if self.indexed:
            return None
        where = self.sources.spans_dirs or self.sources.roots
        return f"no span files found in {', '.join(str(p) for p in where)}"

    def close(self) -> None:
        self.con.close()
