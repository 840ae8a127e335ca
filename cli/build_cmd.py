"""`tinkertrace build-trajectories`: spans folder → triplets.parquet and trajectories.parquet."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from tinkertrace.cli.extras import needs_extra


def parse_time(value: str | None, option: str) -> datetime | None:
    """An ISO-8601 date or time (UTC unless it names a zone), or a clear error naming the option."""
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise typer.BadParameter(f"{value!r} is not an ISO-8601 date/time", param_hint=option) from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def build_trajectories_cmd(
    spans_dir: Annotated[
        Path, typer.Argument(help="Folder of span Parquet files (collector or embedded sink).")
    ],
    out: Annotated[
        Path, typer.Option("-o", "--out", help="Output folder for triplets.parquet and trajectories.parquet.")
    ],
    since: Annotated[
        str | None,
        typer.Option(help="Only rollouts that started at or after this ISO time (UTC unless given)."),
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="Only rollouts that started before this ISO time (UTC unless given).")
    ] = None,
    split: Annotated[
        list[str] | None, typer.Option(help="Only rollouts of this split (train, eval); repeatable.")
    ] = None,
    task: Annotated[list[str] | None, typer.Option(help="Only rollouts of this task id; repeatable.")] = None,
    status: Annotated[
        list[str] | None,
        typer.Option(
            help=(
                "Only rollouts with this status: succeeded, failed (the agent raised) or unknown (no "
                "root span or no status recorded); repeatable. Default: all, failed ones included."
            )
        ),
    ] = None,
    agent: Annotated[
        str | None,
        typer.Option(help="Only LLM calls whose agent name matches this regular expression (searched, RE2)."),
    ] = None,
    min_policy_version: Annotated[
        int | None, typer.Option(help="Only LLM calls sampled by this policy version or newer.")
    ] = None,
    reward_policy: Annotated[
        str,
        typer.Option(
            help=(
                "How rewards reach LLM calls (calls with token ids only): nearest (newest earlier "
                "unrewarded call of the reward's agent span, else of the rollout), sibling (same, under "
                "the same parent span), link (by gen_ai.response.id, else nearest), final (the "
                "rollout's final reward on every call)."
            )
        ),
    ] = "nearest",
    reward_name: Annotated[
        str | None, typer.Option(help="Reward dimension to use (default: each reward's primary dimension).")
    ] = None,
    group_by: Annotated[
        str, typer.Option(help="GRPO group key of trajectories: task or task+agent.")
    ] = "task",
    include_incomplete: Annotated[
        bool,
        typer.Option(
            help=(
                "Also build rollouts whose root span is missing or that lack LLM/reward spans "
                "their root counted."
            )
        ),
    ] = False,
    memory_limit: Annotated[
        str,
        typer.Option(
            help=(
                "DuckDB memory limit (e.g. 512MB, 2GB); DuckDB spills past it to a temporary folder "
                "and the token data is processed in buckets sized from it. Peak memory is about "
                "this limit + ~200 MB, whatever the data size."
            )
        ),
    ] = "512MB",
    task_key: Annotated[
        str,
        typer.Option(
            help=(
                "For traces without tinkertrace's SDK (no span carries a rollout id: each trace's root "
                "span is a rollout), the root span's (or resource's) attribute naming the task, the GRPO "
                "group key: e.g. session.id, gen_ai.conversation.id."
            )
        ),
    ] = "tinkertrace.task.id",
    tokenizer: Annotated[
        str | None,
        typer.Option(
            help=(
                "Tokenizer of the served model (tinkertrace/tiny-chat or a local Hugging Face folder): "
                "re-tokenises LLM calls whose producer stored text only (OpenLLMetry, the official GenAI "
                "instrumentation, Logfire) with its chat template, tools included; those triplets say "
                "token_source = retokenized. Without it such calls are counted, not built."
            )
        ),
    ] = None,
    threads: Annotated[int | None, typer.Option(help="DuckDB threads (default: all cores).")] = None,
    buckets: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=256,
            help=(
                "Process the token data in this many slices (1-256); default: from the token data's "
                "size and --memory-limit. Output is identical whatever the count."
            ),
        ),
    ] = None,
) -> None:
    """Rebuild token-level triplets (one row per LLM call) and trajectories (one row per rollout and
    agent, turns merged while each prompt extends the previous prompt + response) from spans.

    Reads tinkertrace's SDK spans and other producers' (OpenInference, the OpenTelemetry GenAI
    conventions, OpenLLMetry, Logfire, Agent-lightning, AgentOps). Exits 1, saying what it saw and what
    to do, when the folder had spans but no triplet could be built."""
    from rich.console import Console
    from rich.table import Table

    from tinkertrace.builder import BuildOptions, build_trajectories
    from tinkertrace.collector.wal import unflushed_wal_note

    console = Console()
    if not spans_dir.is_dir():
        raise typer.BadParameter(f"spans folder {spans_dir} does not exist", param_hint="SPANS_DIR")
    try:
        options = BuildOptions(
            since=parse_time(since, "--since"),
            until=parse_time(until, "--until"),
            splits=tuple(split or ()),
            tasks=tuple(task or ()),
            statuses=tuple(status or ()),
            agent=agent,
            min_policy_version=min_policy_version,
            reward_policy=reward_policy,  # type: ignore[arg-type]
            reward_name=reward_name,
            group_by=group_by,  # type: ignore[arg-type]
            include_incomplete=include_incomplete,
            memory_limit=memory_limit,
            threads=threads,
            buckets=buckets,
            task_key=task_key,
            tokenizer=tokenizer,
        )
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
