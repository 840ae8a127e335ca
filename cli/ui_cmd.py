"""`tinkertrace ui`: a local web app to watch a run and see every token the trainer sees."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tinkertrace.cli.extras import needs_extra
from tinkertrace.cli.options import OptionsOf, config_option, validated, with_settings
from tinkertrace.cli.paths import existing
from tinkertrace.ui.settings import UiSettings


@with_settings
def ui(
    settings: dict[str, Any] = OptionsOf(UiSettings),
    config: Annotated[Path | None, config_option(UiSettings, section="ui")] = None,
) -> None:
    """Serve a read-only web page over a run: training metrics as plots, the rollouts (paged, sortable,
    filtered, searchable), one rollout's span timeline, messages and reward landings, each trajectory
    token by token (trained mask, sampler logprob, advantage, splits, re-tokenised calls), and the
    build report. A live run's new rollouts and steps appear without a restart. Nothing is written to
    the run folder and nothing is fetched from the network."""
    for path in settings.get("paths") or []:  # checked before the settings, which only say "missing"
        existing(path, "folder", folder=False)
    run = validated(UiSettings, settings, config, section="ui")
    for path in run.folders:  # those from --config
        existing(path, "folder", folder=False)
    from rich.console import Console

    from tinkertrace.ui.server import serve

    console = Console(stderr=True)
    try:
        serve(
            run.folders,
            host=run.host,
            port=run.port,
            token=run.token,
            refresh_s=run.refresh_seconds,
            memory_limit=run.memory_limit,
            console=console,
        )
    except OSError as exc:  # the port is taken, the address is not ours: one line, no traceback
        typer.echo(f"error: {exc.strerror or exc}; choose another --port (0: a free one)", err=True)
        raise typer.Exit(1) from None


def register(app: typer.Typer) -> None:
    """Add `tinkertrace ui` to the main app."""
    app.command("ui")(needs_extra("ui", "ui")(ui))
