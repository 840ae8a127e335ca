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
    steps: Annotated[int, typer.Option(help="Training steps to run (each publishes a new policy).")] = 40,
    workers: Annotated[int, typer.Option(help="Concurrent agent worker processes.")] = 2,
    max_seconds: Annotated[
        float, typer.Option(help="Stop training after this many seconds even if --steps is not reached.")
    ] = 170.0,
    group_size: Annotated[int, typer.Option(help="Rollouts per question (one GRPO group).")] = 8,
    learning_rate: Annotated[float, typer.Option(help="Adam learning rate of the LoRA weights.")] = 5e-3,
    model: Annotated[
        str, typer.Option(help="Built-in model size to train: tinkertrace/tiny-chat:nano|small|base.")
    ] = "tinkertrace/tiny-chat:small",
) -> None:
    """Run the online RL loop on this machine (no keys, no network) and show the reward rising.

    Starts the collector and an OpenAI-compatible endpoint (local engine, built-in model) on free
    loopback ports, runs identity agents (plain OpenAI client + @traced_rollout) in WORKERS processes,
    trains in follow mode and swaps each new policy into the endpoint. Ends with a summary table,
    summary.json and reward_curve.png in the output folder.
    """
    from tinkertrace.online.demo import DemoSettings, run_demo

    if steps < 1 or workers < 1 or group_size < 2 or max_seconds <= 0:
        raise typer.BadParameter("--steps and --workers must be ≥ 1, --group-size ≥ 2, --max-seconds > 0")
    folder = out or Path(f"tinkertrace-demo-{datetime.now():%Y%m%d-%H%M%S}")
    run_demo(
        DemoSettings(
            out=folder,
            steps=steps,
            workers=workers,
            max_seconds=max_seconds,
            group_size=group_size,
            learning_rate=learning_rate,
            model=model,
        )
    )


def register(app: typer.Typer) -> None:
    """Add `tinkertrace demo` to the main app."""
    app.command("demo")(demo)
