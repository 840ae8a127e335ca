"""`tinkertrace demo`: the whole online loop (collector, endpoint, agents, follow training) locally."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer


def demo(
    out: Annotated[
        Path | None,
        typer.Option(help="Output folder (default: a new ./tinkertrace-demo-<timestamp>/)."),
    ] = None,
    steps: Annotated[
        int | None, typer.Option(help="Training steps to run, each publishes a new policy (default 60).")
    ] = None,
    workers: Annotated[int | None, typer.Option(help="Concurrent agent worker processes (2).")] = None,
    max_seconds: Annotated[
        float | None,
        typer.Option(help="Stop training after this many seconds even if --steps is not reached (150)."),
    ] = None,
    group_size: Annotated[int | None, typer.Option(help="Rollouts per question, one GRPO group (8).")] = None,
    learning_rate: Annotated[
        float | None, typer.Option(help="Adam learning rate of the LoRA weights (default 3e-3).")
    ] = None,
    loss: Annotated[
        str | None,
        typer.Option(help="Policy-gradient loss: ppo (default, clipped ratio) or importance_sampling."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help="Built-in model to train: tinkertrace/tiny-chat:nano|small|base (default small)."),
    ] = None,
) -> None:
    """Run the online RL loop on this machine (no keys, no network) and show the reward rising.

    Starts the collector and an OpenAI-compatible endpoint (local engine, built-in model) on free
    loopback ports, runs identity agents (plain OpenAI client + @traced_rollout) in WORKERS processes,
    trains in follow mode and swaps each new policy into the endpoint. Ends with a summary table,
    summary.json and reward_curve.png in the output folder.
    """
    from tinkertrace.online.demo import DemoSettings, run_demo

    given = {
        "steps": steps,
        "workers": workers,
        "max_seconds": max_seconds,
        "group_size": group_size,
        "learning_rate": learning_rate,
        "loss": loss,
        "model": model,
    }
    settings = DemoSettings(
        out=out or Path(f"tinkertrace-demo-{datetime.now():%Y%m%d-%H%M%S}"),
        **{k: v for k, v in given.items() if v is not None},
    )
    if settings.steps < 1 or settings.workers < 1 or settings.group_size < 2 or settings.max_seconds <= 0:
        raise typer.BadParameter("--steps and --workers must be ≥ 1, --group-size ≥ 2, --max-seconds > 0")
    if settings.loss not in ("ppo", "importance_sampling"):
        raise typer.BadParameter("--loss must be ppo or importance_sampling")
    run_demo(settings)


def register(app: typer.Typer) -> None:
    """Add `tinkertrace demo` to the main app."""
    app.command("demo")(demo)
