"""`tinkertrace demo`: the whole online loop (collector, endpoint, agents, follow training) locally."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from tinkertrace.cli.extras import needs_extra
from tinkertrace.cli.options import OptionsOf, config_option, validated, with_settings
from tinkertrace.online.settings import DemoSettings


@with_settings
def demo(
    out: Annotated[
        Path | None,
        typer.Option(help="Output folder (default: a new ./tinkertrace-demo-<timestamp>/)."),
    ] = None,
    settings: dict[str, Any] = OptionsOf(DemoSettings),
    config: Annotated[Path | None, config_option(DemoSettings, section="demo")] = None,
    ui: Annotated[
        bool,
        typer.Option(
            "--ui",
            help="Also serve `tinkertrace ui` over the output folder (loopback; the URL is printed) and keep "
            "it serving after the demo until Ctrl-C.",
        ),
    ] = False,
) -> None:
    """Run the online RL loop on this machine (no keys, no network) and show the reward rising.

    Starts the collector and an OpenAI-compatible endpoint (local engine) on free loopback ports, runs
    the task's agents (plain OpenAI client + @traced_rollout) in WORKERS processes: on the built-in
    model they learn to say who they are; on a pretrained one (--model smollm2-135m-instruct, after
    `make smollm2`) to answer sums with only the number. It trains in follow mode and swaps each new
    policy into the endpoint. Ends with a summary table, summary.json and reward_curve.png in the
    output folder.
    """
    from tinkertrace.online.demo import run_demo

    folder = out or Path(f"tinkertrace-demo-{datetime.now():%Y%m%d-%H%M%S}")
    checked = validated(DemoSettings, {**settings, "out": folder}, config, section="demo")
    if not ui:
        run_demo(checked)
        return
    from tinkertrace.ui.server import serve_beside

    with serve_beside(folder) as url:
        run_demo(checked)
        typer.echo(f"tinkertrace ui still serving the finished run at {url} — Ctrl-C to stop")
        wait_for_interrupt()


def wait_for_interrupt() -> None:
    """Block until Ctrl-C."""
    import contextlib
    import threading

    with contextlib.suppress(KeyboardInterrupt):
        threading.Event().wait()


def register(app: typer.Typer) -> None:
    """Add `tinkertrace demo` to the main app."""
    app.command("demo")(needs_extra("all", "demo")(demo))
