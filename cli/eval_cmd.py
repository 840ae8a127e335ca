"""`tinkertrace eval`: run an agent over a task split without training and report pass@k."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tinkertrace.cli.extras import needs_extra
from tinkertrace.cli.options import OptionsOf, config_option, validated, with_settings
from tinkertrace.cli.paths import local
from tinkertrace.evaluation.settings import EvalSettings
from tinkertrace.extras import require


@with_settings
def eval_command(
    settings: dict[str, Any] = OptionsOf(EvalSettings),
    config: Annotated[Path | None, config_option(EvalSettings, section="eval")] = None,
) -> None:
    """Run AGENT on every task of a split several times and report pass@k (unbiased estimator).

    Against an endpoint of your own (--base-url) it needs only the `parquet` extra; without one it serves
    --model itself and needs `serve` (and `engine` for a local model)."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from tinkertrace.evaluation.evaluate import evaluate, summary_path

    console = Console(soft_wrap=True)
    run = validated(EvalSettings, settings, config, section="eval")
    local(run.out, "results file")  # both written here (created when missing), locally only
    if run.spans_dir is not None:
        local(run.spans_dir, "spans folder")
    if run.base_url is None:  # the local endpoint serves --model with the engine
        require("serve", "`tinkertrace eval` without --base-url")
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task("rollouts", total=None)
        try:
            summary = evaluate(run, on_result=lambda _: progress.advance(bar))
        except ValueError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2) from None
    table = Table(title=f"eval: {run.agent} on {run.split}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("tasks", str(summary.tasks))
    table.add_row("rollouts", str(summary.rollouts))
    table.add_row("failed rollouts", str(summary.failed_rollouts))
    table.add_row("mean reward", f"{summary.mean_reward:.4f}")
    for name, value in summary.pass_at_k.items():
        table.add_row(name, f"{value:.4f}")
    console.print(table)
    console.print(f"results: {run.out}  summary: {summary_path(run.out)}")


def register(app: typer.Typer) -> None:
    """Add `tinkertrace eval` to the main app."""
    app.command("eval")(needs_extra("parquet", "eval")(eval_command))
