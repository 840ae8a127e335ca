"""`tinkertrace spans ...`: maintain and inspect folders of span Parquet files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tinkertrace.cli.extras import needs_extra
from tinkertrace.cli.options import OptionsOf, validated, with_settings
from tinkertrace.cli.paths import existing
from tinkertrace.spanstore.settings import CompactSettings

spans_app = typer.Typer(
    help="Inspect and maintain span Parquet folders (written by the collector or the SDK)."
)

SpansDir = Annotated[Path, typer.Argument(help="Folder of span Parquet files (hive date=/hour= partitions).")]


@spans_app.command()
@needs_extra("build", "spans compact")
@with_settings
def compact(spans_dir: SpansDir, settings: dict[str, Any] = OptionsOf(CompactSettings)) -> None:
    """Merge small files of closed partitions (atomic, no duplicates, safe while a collector runs)."""
    from rich.console import Console

    from tinkertrace.collector.settings import MiB
    from tinkertrace.spanstore.compact import compact as run_compact

    spans_dir = existing(spans_dir)
    checked = validated(CompactSettings, settings)
    report = run_compact(
        spans_dir,
        small_file_bytes=int(checked.small_mb * MiB),
        target_file_bytes=int(checked.target_mb * MiB),
        grace_s=checked.grace_seconds,
        zstd_level=checked.zstd_level,
    )
    console = Console()
    console.print(
        f"compacted {report.merged_files} files into {report.output_files} ({report.rows} rows) "
        f"in {len(report.partitions)} partition(s)"
        + (f"; finished {report.rolled_forward} interrupted merge(s)" if report.rolled_forward else "")
    )
    for path, reason in report.skipped:
        console.print(f"[yellow]skipped {path}: {reason}[/yellow]")


@spans_app.command()
@needs_extra("build", "spans stats")
def stats(spans_dir: SpansDir) -> None:
    """Print span counts by partition, by service and by span type."""
    import duckdb
    from rich.console import Console
    from rich.table import Table

    from tinkertrace.spanstore.reader import open_spans

    spans_dir = existing(spans_dir)
    con = duckdb.connect()
    report = open_spans(con, spans_dir)
    console = Console()
    _note_if_empty(report.files, report.skipped, spans_dir)
    queries = {
        "partition": "SELECT strftime(date, '%Y-%m-%d') || ' ' || lpad(hour::VARCHAR, 2, '0') AS partition, "
        "count(DISTINCT filename) AS files, count(*) AS spans FROM spans GROUP BY ALL ORDER BY 1",
        "service": "SELECT coalesce(service_name, '(none)') AS service, count(*) AS spans, "
        "count(DISTINCT rollout_id) AS rollouts FROM spans GROUP BY ALL ORDER BY 2 DESC",
        "span type": "SELECT coalesce(span_type, '(other)') AS span_type, count(*) AS spans FROM spans "
        "GROUP BY ALL ORDER BY 2 DESC",
    }
    for title, sql in queries.items():
        result = con.execute(sql)
        table = Table(title=f"spans by {title}")
        for column in result.description:
            table.add_column(column[0], justify="left" if column == result.description[0] else "right")
        for row in result.fetchall():
            table.add_row(*(str(v) for v in row))
        console.print(table)
    total = con.execute("SELECT count(*) FROM spans").fetchone()[0]  # type: ignore[index]
    console.print(f"{total} spans in {len(report.files)} file(s) under {spans_dir}")
    for path, reason in report.skipped:
        console.print(f"[yellow]skipped {path}: {reason}[/yellow]")


@spans_app.command()
@needs_extra("build", "spans query")
def query(
    spans_dir: SpansDir,
    sql: Annotated[str, typer.Argument(help="SQL over the views spans, llm_calls, rewards and rollouts.")],
    format: Annotated[
        str,
        typer.Option("--format", "-f", help="table (printed), csv, json (one object per line) or parquet."),
    ] = "table",
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write the result to this file (needed for parquet)."),
    ] = None,
    limit: Annotated[int, typer.Option(help="Rows to print in table format.")] = 50,
) -> None:
    """Run SQL against ready-made views of a spans folder (see docs/builder.md for their columns)."""
    from rich.console import Console
    from rich.table import Table

    from tinkertrace.builder.query import QueryError, export, fetch, open_query_views
    from tinkertrace.collector.wal import unflushed_wal_note

    console = Console()
    if format not in ("table", "csv", "json", "parquet"):
        raise typer.BadParameter(
            f"unknown format {format!r}: use table, csv, json or parquet", param_hint="--format"
        )
    spans_dir = existing(spans_dir)
    con, report = open_query_views(spans_dir)
    _note_if_empty(report.files, report.skipped, spans_dir)
    if note := unflushed_wal_note(spans_dir):  # spans a collector acknowledged, not in Parquet yet
        typer.echo(note, err=True)
    for path, reason in report.skipped:
        console.print(f"[yellow]skipped {path}: {reason}[/yellow]", highlight=False)
    try:
        if format == "table" and output is None:
            result = fetch(con, sql, limit)
            table = Table()
            for name in result.column_names:
                table.add_column(name)
            for row in zip(*(col.to_pylist() for col in result.columns), strict=True):
                table.add_row(*("NULL" if v is None else str(v) for v in row))
            console.print(table)
        else:
            text = export(con, sql, "csv" if format == "table" else format, output)  # type: ignore[arg-type]
            if text is not None:
                typer.echo(text, nl=False)
            else:
                console.print(f"wrote {output}")
    except QueryError as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from exc


def _note_if_empty(files: list[Path], skipped: list[tuple[Path, str]], spans_dir: Path) -> None:
    """Say on stderr that an existing folder holds no span file (its result is empty, not an error)."""
    if not files and not skipped:
        typer.echo(f"note: no span files under {spans_dir}", err=True)


def register(app: typer.Typer) -> None:
    """Add the `spans` sub-group to the main app."""
    app.add_typer(spans_app, name="spans")
