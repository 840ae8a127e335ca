"""`tinkertrace eval`: run an agent over a task split without training and report pass@k."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def _parse_ks(text: str) -> list[int]:
    try:
        ks = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise typer.BadParameter(f"--k must be comma-separated whole numbers, got {text!r}") from None
    if not ks or ks[0] < 1:
        raise typer.BadParameter(f"--k values must be at least 1, got {text!r}")
    return ks


def eval_command(
    agent: Annotated[
        str,
        typer.Argument(help="The agent function, as path/to/file.py:function or package.module:function."),
    ],
    tasks: Annotated[
        str,
        typer.Option(
            "--tasks", help="The task source, path/to/file.py:function or module:function (takes split=)."
        ),
    ],
    split: Annotated[
        str, typer.Option("--split", help="Which split of the task source to evaluate.")
    ] = "test",
    samples_per_task: Annotated[
        int, typer.Option("--samples-per-task", "-n", min=1, help="Rollouts per task (n in pass@k).")
    ] = 4,
    k: Annotated[
        str, typer.Option("--k", help="Comma-separated k values for pass@k, each <= samples per task.")
    ] = "1",
    base_url: Annotated[
        str | None,
        typer.Option(
            "--base-url",
            help="OpenAI-compatible endpoint (…/v1). Default: start a local endpoint serving --model.",
        ),
    ] = None,
    model: Annotated[
        str, typer.Option("--model", help="Model name sent to the endpoint (and served locally).")
    ] = "tinkertrace/tiny-chat",
    api_key: Annotated[
        str, typer.Option("--api-key", envvar="OPENAI_API_KEY", help="API key for the endpoint.")
    ] = "EMPTY",
    temperature: Annotated[
        float | None,
        typer.Option(
            "--temperature", help="Sampling temperature passed to the agent (default: the agent's)."
        ),
    ] = None,
    max_tasks: Annotated[
        int | None, typer.Option("--max-tasks", min=1, help="Evaluate only the first N tasks.")
    ] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Rollouts running at once.")] = 8,
    threshold: Annotated[
        float, typer.Option("--success-threshold", help="A rollout passes when its reward is at least this.")
    ] = 1.0,
    spans_dir: Annotated[
        Path | None,
        typer.Option(
            "--spans-dir",
            help="Spans folder for the rollouts' traces (default: <out stem>.spans/ next to --out).",
        ),
    ] = None,
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            help="JSONL file, one line per rollout; the summary goes next to it as <name>.summary.json.",
        ),
    ] = Path("eval_results.jsonl"),
) -> None:
    """Run AGENT on every task of a split several times and report pass@k (unbiased estimator)."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from tinkertrace.evaluation import evaluate, summary_path

    ks = _parse_ks(k)
    console = Console(soft_wrap=True)
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task("rollouts", total=None)
        try:
            summary = evaluate(
                agent,
                tasks,
                out=out,
                split=split,
                samples_per_task=samples_per_task,
                ks=ks,
                base_url=base_url,
                model=model,
                api_key=api_key,
                temperature=temperature,
                max_tasks=max_tasks,
                concurrency=concurrency,
                success_threshold=threshold,
                spans_dir=spans_dir,
                on_result=lambda _: progress.advance(bar),
            )
        except ValueError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2) from None
    table = Table(title=f"eval: {agent} on {split}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("tasks", str(summary.tasks))
    table.add_row("rollouts", str(summary.rollouts))
    table.add_row("failed rollouts", str(summary.failed_rollouts))
    table.add_row("mean reward", f"{summary.mean_reward:.4f}")
    for name, value in summary.pass_at_k.items():
        table.add_row(name, f"{value:.4f}")
    console.print(table)
    console.print(f"results: {out}  summary: {summary_path(out)}")


def register(app: typer.Typer) -> None:
    """Add `tinkertrace eval` to the main app."""
    app.command("eval")(eval_command)
