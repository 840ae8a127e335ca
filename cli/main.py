"""Entry point of the `tinkertrace` command: each module below adds its commands to one Typer app.

Command modules import their heavy dependencies (torch, DuckDB, servers) inside the command
functions, so `tinkertrace --help` stays fast.
"""

from __future__ import annotations

import typer

from tinkertrace import __version__
from tinkertrace.cli import (
    build_cmd,
    collector_cmd,
    demo_cmd,
    engine_cmd,
    eval_cmd,
    proxy_cmd,
    serve_cmd,
    spans_cmd,
    train_cmd,
    ui_cmd,
)
from tinkertrace.cli.help_layout import HelpLayoutGroup, reflow_help

app = typer.Typer(
    name="tinkertrace",
    help=(
        "Trace an existing LLM agent with OpenTelemetry, rebuild token-level trajectories from its "
        "spans, and train it with reinforcement learning on Tinker or the local engine."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    cls=HelpLayoutGroup,
)


@app.command()
def version() -> None:
    """Print the tinkertrace version."""
    typer.echo(__version__)


COMMANDS = (
    collector_cmd, spans_cmd, build_cmd, train_cmd, serve_cmd, proxy_cmd,
    engine_cmd, eval_cmd, demo_cmd, ui_cmd,
)  # fmt: skip
for module in COMMANDS:
    module.register(app)
reflow_help(app)


if __name__ == "__main__":
    app()
