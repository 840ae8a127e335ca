"""`build_trajectories`: spans folder → triplets.parquet and trajectories.parquet.

The build is one pass over named stages (:func:`_build_into`): sources → re-tokenised ids → typed
spans → spans → rollouts → calls → rewards → triplets → trajectories. Each stage takes the DuckDB
relations it reads and returns the one it created (:mod:`.sources` for the files, :mod:`.retokenize`
for text-only calls' ids, :mod:`.views` for the views over the files, :mod:`.stages` and
:mod:`.event_rewards` for the token-free tables, :mod:`.rewards` for the assignment, :mod:`.stream`
for the token join, :mod:`.trajectories` for the merge), so what each reads is in its call.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tinkertrace import schemas
from tinkertrace.builder import stages, stream, views
from tinkertrace.builder.event_rewards import add_event_rewards
from tinkertrace.builder.options import BuildSettings
from tinkertrace.builder.output import AtomicParquetWriter
from tinkertrace.builder.retokenize import retokenize
from tinkertrace.builder.rewards import assign_rewards, count_rewards
from tinkertrace.builder.sources import Sources, open_sources
from tinkertrace.builder.summary import BuildSummary
from tinkertrace.builder.trajectories import merge_turns

TRIPLETS_FILE = "triplets.parquet"
TRAJECTORIES_FILE = "trajectories.parquet"


@dataclass
class BuildResult:
    """The built tables and the summary. With an output folder the tables are read from its files
    on first access (so a large build never has to fit in memory)."""

    summary: BuildSummary
    triplets_path: Path | None = None
    trajectories_path: Path | None = None
    _tables: dict[str, pa.Table] = field(default_factory=dict, repr=False)

    def _table(self, name: str, path: Path | None) -> pa.Table:
        if name not in self._tables:
            assert path is not None
            self._tables[name] = pq.read_table(path, schema=getattr(schemas, name)())
        return self._tables[name]

    @property
    def triplets(self) -> pa.Table:
        return self._table("triplets", self.triplets_path)

    @property
    def trajectories(self) -> pa.Table:
        return self._table("trajectories", self.trajectories_path)


def connect(options: BuildSettings, temp_dir: Path) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the build's memory limit, threads and spill folder."""
    con = duckdb.connect(
        config={
            "memory_limit": options.memory_limit,
            "temp_directory": str(temp_dir),
        }
    )
    con.execute("SET enable_progress_bar = false")  # it would print into our stdout
    con.execute("SET allocator_flush_threshold = '16MB'")  # give freed memory back to the OS early
    if options.threads:
        con.execute(f"SET threads = {int(options.threads)}")
    return con


def _stream_rows(
    batches: Iterator[pa.RecordBatch], trip_out: AtomicParquetWriter, traj_tmp: AtomicParquetWriter,
    summary: BuildSummary,
) -> None:  # fmt: skip
    """Write triplets as they stream; merge turns of whole rollouts (carrying a rollout cut by a
    batch boundary over to the next batch) into ``traj_tmp``."""
    carry: pa.Table | None = None
    n_trip = len(stream.TRIPLET_COLUMNS)
    missing_logprobs = 0

    def flush(table: pa.Table) -> None:
        nonlocal missing_logprobs
        rows, missing = merge_turns(table)
        missing_logprobs += missing
        traj_tmp.write(rows)

    for batch in batches:
        table = pa.Table.from_batches([batch])
        trip_out.write(table.select(list(range(n_trip))))
        table = table if carry is None else pa.concat_tables([carry, table])
        rollout = table.column("rollout_id")
        cut = pc.index(rollout, rollout[-1]).as_py()
        if cut > 0:
            flush(table.slice(0, cut))
        carry = table.slice(cut)
    if carry is not None and carry.num_rows:
        flush(carry)
    summary.llm_calls_without_logprobs = missing_logprobs


def _sort_trajectories(
    con: duckdb.DuckDBPyConnection, unsorted: Path, out: AtomicParquetWriter, batch: int
) -> None:
    reader = con.sql(
        "SELECT * FROM read_parquet($f) ORDER BY group_key, rollout_id, agent_name NULLS FIRST, segment",
        params={"f": str(unsorted)},
    ).to_arrow_reader(batch)
    for b in reader:
        out.write(pa.Table.from_batches([b]))


def _sources(
    con: duckdb.DuckDBPyConnection, spans_dir: Path, options: BuildSettings, summary: BuildSummary
) -> tuple[Sources, int]:
    """The span and log files under ``spans_dir`` as views, and how many token buckets their size
    needs (``options.buckets`` when given)."""
    sources = open_sources(con, spans_dir, options.files)
    summary.files = len(sources.report.files)
    summary.corrupt_files = list(sources.report.skipped)
    buckets = options.buckets or stream.choose_buckets(
        stream.token_bytes(con, sources.report.files), stream.memory_limit_bytes(con)
    )
    summary.buckets = buckets  # reported; the stages are given the value itself
    return sources, buckets


def _retokenized(
    con: duckdb.DuckDBPyConnection, sources: Sources, options: BuildSettings, summary: BuildSummary
) -> views.Relation | None:
    """Token ids for the text-only calls of ``sources`` from ``options.tokenizer`` (None: none
    rebuilt)."""
    tokenizer = None
    if options.tokenizer is not None:
        from tinkertrace.models.tokenizer import (  # transformers: only here
            TokenizerNotFoundError,
            load_tokenizer,
        )

        try:
            tokenizer = load_tokenizer(options.tokenizer)
        except TokenizerNotFoundError as exc:
            raise ValueError(str(exc)) from exc
    table, not_rebuilt = retokenize(con, sources.raw, sources.logs, tokenizer)
    summary.llm_calls_not_rebuilt = dict(sorted(not_rebuilt.items()))
    if table is not None:
        summary.llm_calls_retokenized = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[index]
    return table


def _build_into(spans_dir: Path, out_dir: Path, options: BuildSettings, work: Path) -> BuildSummary:
    """The build: each stage takes the relations it reads and returns the one it made (filling the
    summary's counts on the way)."""
    summary = BuildSummary()
    con = connect(options, work)
    try:
        sources, buckets = _sources(con, spans_dir, options, summary)  # span files, log files
        rebuilt = _retokenized(con, sources, options, summary)  # ids of text-only calls
        typed = views.create_typed(con, sources.raw, rebuilt)  # each producer's spans in our columns
        spans_view = views.create_spans(con, sources.raw, typed, task_key=options.task_key)
        spans = stages.spans(con, spans_view, summary)  # token-free
        spans = add_event_rewards(con, spans, sources)  # GenAI evaluation events as reward rows
        rollouts = stages.rollouts(con, spans, options, summary)
        scopes = stages.agent_scopes(con, spans, rollouts)
        parents = stages.parents(con, spans, rollouts, options, summary)
        calls = stages.calls(con, spans, rollouts, scopes, parents, summary)
        rewards = stages.rewards(con, spans, rollouts, scopes, parents, options, summary)
        stages.drop(con, spans, rollouts, scopes, parents)  # read by no later stage: their memory goes on
        assigned = assign_rewards(con, calls, rewards, options.reward_policy)
        count_rewards(con, calls, rewards, assigned, options, summary)
        chosen = stages.chosen_calls(con, calls, assigned, options, summary, buckets)
        stages.drop(con, calls, rewards, assigned)
        triplets = stream.triplet_stream(con, chosen, typed, options.batch_rows, buckets, work)
        _write(con, triplets, out_dir, options, summary, work)  # triplets, merged into trajectories
    finally:
        con.close()
    return summary


def _write(
    con: duckdb.DuckDBPyConnection, triplets: Iterator[pa.RecordBatch], out_dir: Path,
    options: BuildSettings, summary: BuildSummary, work: Path,
) -> None:  # fmt: skip
    """Write ``triplets`` and the trajectories merged from them into ``out_dir`` (atomically); count
    what was written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    trip_path, traj_path = out_dir / TRIPLETS_FILE, out_dir / TRAJECTORIES_FILE
    if options.group_by == "task":
        # the stream is ordered by (group_key, rollout_id, turn): trajectories come out sorted
        with (
            AtomicParquetWriter(trip_path, schemas.triplets()) as trip_out,
            AtomicParquetWriter(traj_path, schemas.trajectories()) as traj_out,
        ):
            _stream_rows(triplets, trip_out, traj_out, summary)
            summary.triplets, summary.trajectories = trip_out.rows, traj_out.rows
            traj_out.commit()
            trip_out.commit()
    else:
        unsorted = work / "trajectories.unsorted.parquet"
        with (
            AtomicParquetWriter(trip_path, schemas.triplets()) as trip_out,
            AtomicParquetWriter(unsorted, schemas.trajectories()) as traj_tmp,
        ):
            _stream_rows(triplets, trip_out, traj_tmp, summary)
            traj_tmp.commit()
            with AtomicParquetWriter(traj_path, schemas.trajectories()) as traj_out:
                _sort_trajectories(con, unsorted, traj_out, options.batch_rows)
                summary.trajectories = traj_out.rows
                traj_out.commit()
            summary.triplets = trip_out.rows
            trip_out.commit()
    summary.llm_calls_without_tokens = summary.llm_calls - summary.llm_calls_filtered - summary.triplets
    splits = con.execute(
        "SELECT split_reason, count(*) FROM read_parquet($f) WHERE split_reason IS NOT NULL GROUP BY ALL",
        {"f": str(traj_path)},
    ).fetchall()
    summary.trajectory_splits = dict(sorted(splits))
    sources = con.execute(
        "SELECT COALESCE(token_source, 'unknown'), count(*) FROM read_parquet($f) GROUP BY ALL",
        {"f": str(trip_path)},
    ).fetchall()
    summary.triplets_by_token_source = dict(sorted(sources))


def build_trajectories(
    spans_dir: Path, out_dir: Path | None = None, options: BuildSettings | None = None
) -> BuildResult:
    """Build triplets and trajectories from the spans under ``spans_dir``.

    With ``out_dir``, writes ``triplets.parquet`` and ``trajectories.parquet`` there atomically and
    the result reads them lazily; without, the tables are built in a temporary folder and returned
    in memory. Re-running on the same input gives identical files.
    """
    options = options or BuildSettings()
    spans_dir = Path(spans_dir)
    with tempfile.TemporaryDirectory(prefix="tinkertrace-build-") as tmp:
        work = Path(tmp)
        if out_dir is not None:
            out = Path(out_dir)
            summary = _build_into(spans_dir, out, options, work)
            return BuildResult(summary, out / TRIPLETS_FILE, out / TRAJECTORIES_FILE)
        summary = _build_into(spans_dir, work / "out", options, work)
        result = BuildResult(summary, work / "out" / TRIPLETS_FILE, work / "out" / TRAJECTORIES_FILE)
        _ = result.triplets, result.trajectories  # load before the folder goes away
        result.triplets_path = result.trajectories_path = None
        return result
