"""`build_trajectories`: spans folder → triplets.parquet and trajectories.parquet."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tinkertrace import schemas
from tinkertrace.builder import stream, views
from tinkertrace.builder import triplets as trip
from tinkertrace.builder.options import BuildOptions
from tinkertrace.builder.output import AtomicParquetWriter
from tinkertrace.builder.retokenize import retokenize
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


def connect(options: BuildOptions, temp_dir: Path) -> duckdb.DuckDBPyConnection:
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
    con: duckdb.DuckDBPyConnection, options: BuildOptions, trip_out: AtomicParquetWriter,
    traj_tmp: AtomicParquetWriter, summary: BuildSummary, work: Path,
) -> None:  # fmt: skip
    """Write triplets as they stream; merge turns of whole rollouts (carrying a rollout cut by a
    batch boundary over to the next batch) into ``traj_tmp``."""
    carry: pa.Table | None = None
    n_trip = len(trip.TRIPLET_COLUMNS)
    missing_logprobs = 0

    def flush(table: pa.Table) -> None:
        nonlocal missing_logprobs
        rows, missing = merge_turns(table)
        missing_logprobs += missing
        traj_tmp.write(rows)

    batches = stream.triplet_stream(con, options.batch_rows, summary.buckets, work)
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


def _retokenize(con: duckdb.DuckDBPyConnection, options: BuildOptions, summary: BuildSummary) -> None:
    """Give text-only calls token ids from ``options.tokenizer`` (the views then read them)."""
    tokenizer = None
    if options.tokenizer is not None:
        from tinkertrace.tokenizer import TokenizerNotFoundError, load_tokenizer  # transformers: only here

        try:
            tokenizer = load_tokenizer(options.tokenizer)
        except TokenizerNotFoundError as exc:
            raise ValueError(str(exc)) from exc
    table, not_rebuilt = retokenize(con, tokenizer)
    summary.llm_calls_not_rebuilt = dict(sorted(not_rebuilt.items()))
    if table is not None:
        summary.llm_calls_retokenized = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[index]
        views.create_spans_view(con, task_key=options.task_key, retokenized=table)


def _build_into(spans_dir: Path, out_dir: Path, options: BuildOptions, work: Path) -> BuildSummary:
    summary = BuildSummary()
    con = connect(options, work)
    try:
        report = views.open_views(con, spans_dir, options.files, task_key=options.task_key, derived=False)
        _retokenize(con, options, summary)
        summary.files = len(report.files)
        summary.corrupt_files = list(report.skipped)
        summary.buckets = options.buckets or stream.choose_buckets(
            stream.token_bytes(con, report.files), stream.memory_limit_bytes(con)
        )
        trip.prepare(con, options, summary)
        out_dir.mkdir(parents=True, exist_ok=True)
        trip_path, traj_path = out_dir / TRIPLETS_FILE, out_dir / TRAJECTORIES_FILE
        if options.group_by == "task":
            # the stream is ordered by (group_key, rollout_id, turn): trajectories come out sorted
            with (
                AtomicParquetWriter(trip_path, schemas.triplets()) as trip_out,
                AtomicParquetWriter(traj_path, schemas.trajectories()) as traj_out,
            ):
                _stream_rows(con, options, trip_out, traj_out, summary, work)
                summary.triplets, summary.trajectories = trip_out.rows, traj_out.rows
                traj_out.commit()
                trip_out.commit()
        else:
            unsorted = work / "trajectories.unsorted.parquet"
            with (
                AtomicParquetWriter(trip_path, schemas.triplets()) as trip_out,
                AtomicParquetWriter(unsorted, schemas.trajectories()) as traj_tmp,
            ):
                _stream_rows(con, options, trip_out, traj_tmp, summary, work)
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
            {"f": str(out_dir / TRAJECTORIES_FILE)},
        ).fetchall()
        summary.trajectory_splits = dict(sorted(splits))
        sources = con.execute(
            "SELECT COALESCE(token_source, 'unknown'), count(*) FROM read_parquet($f) GROUP BY ALL",
            {"f": str(out_dir / TRIPLETS_FILE)},
        ).fetchall()
        summary.triplets_by_token_source = dict(sorted(sources))
    finally:
        con.close()
    return summary


def build_trajectories(
    spans_dir: Path, out_dir: Path | None = None, options: BuildOptions | None = None
) -> BuildResult:
    """Build triplets and trajectories from the spans under ``spans_dir``.

    With ``out_dir``, writes ``triplets.parquet`` and ``trajectories.parquet`` there atomically and
    the result reads them lazily; without, the tables are built in a temporary folder and returned
    in memory. Re-running on the same input gives identical files.
    """
    options = options or BuildOptions()
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
