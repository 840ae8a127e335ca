"""`tinkertrace build-trajectories`: spans folder → triplets.parquet and trajectories.parquet."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tinkertrace.builder.options import BuildSettings
from tinkertrace.cli.extras import needs_extra
from tinkertrace.cli.options import OptionsOf, config_option, validated, with_settings
from tinkertrace.cli.paths import existing, local


@with_settings
def build_trajectories_cmd(
    spans_dir: Annotated[
        Path,
        typer.Argument(
            metavar="SPANS_DIR", help="Folder of span Parquet files (collector or embedded sink)."
        ),
    ],
    out: Annotated[
        Path, typer.Option("-o", "--out", help="Output folder for triplets.parquet and trajectories.parquet.")
    ],
    settings: dict[str, Any] = OptionsOf(BuildSettings),
    config: Annotated[Path | None, config_option(BuildSettings, section="build")] = None,
) -> None:
    """Rebuild token-level triplets (one row per LLM call) and trajectories (one row per rollout and
    agent, turns merged while each prompt extends the previous prompt + response) from spans.

    Reads tinkertrace's SDK spans and other producers' (OpenInference, the OpenTelemetry GenAI
    conventions, OpenLLMetry, Logfire, Agent-lightning, AgentOps). Exits 1, saying what it saw and what
    to do, when the folder had spans but no triplet could be built."""
    from rich.console import Console
    from rich.table import Table

    from tinkertrace.builder import build_trajectories
    from tinkertrace.collector.wal import unflushed_wal_note

    console = Console()
    spans_dir = existing(spans_dir)
    out = local(out, "output folder")
    options = validated(BuildSettings, settings, config, section="build")
    try:
        with console.status("building trajectories"):
            result = build_trajectories(spans_dir, out, options)
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    summary = result.summary
    table = Table(title=f"build-trajectories {spans_dir} → {out}")
    table.add_column("what")
    table.add_column("count", justify="right")
    for label, value in summary.rows():
        table.add_row(label, value)
    console.print(table)
    for path, why in summary.corrupt_files:
        console.print(f"[yellow]skipped corrupt file[/yellow] {path}: {why}")
    for rollout_id, span_id in summary.unmatched_rewards[:10]:
        console.print(f"[yellow]unmatched reward[/yellow] span {span_id} of rollout {rollout_id}")
    if summary.rewards_unmatched > 10:
        console.print(f"... and {summary.rewards_unmatched - 10} more unmatched rewards")
    if note := summary.incomplete_note():
        console.print(note, style="yellow", markup=False)
    console.print(f"wrote {result.triplets_path} and {result.trajectories_path}")
    if note := unflushed_wal_note(spans_dir):  # spans a collector acknowledged, not in Parquet yet
        typer.echo(note, err=True)
    if hints := summary.hints():  # spans were read, no triplet came out: say why and what to do
        for hint in hints:
            console.print(f"[red]no triplet built:[/red] {hint}")
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add `build-trajectories` to the main app."""
    app.command("build-trajectories")(needs_extra("build", "build-trajectories")(build_trajectories_cmd))
