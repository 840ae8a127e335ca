"""`tinkertrace ui`: a local web app to watch a run and see every token the trainer sees."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Annotated

import typer

from tinkertrace.cli.extras import needs_extra

TOKEN_ENV = "TINKERTRACE_UI_TOKEN"
DEFAULT_PORT = 8400


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ui_url(host: str, port: int, token: str | None) -> str:
    """The address to open (with the token, which the app then keeps in a cookie)."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")


def ui(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Run folders (a demo's output, a training log folder, a build-trajectories output) or "
            "span folders. Default: the current folder."
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: a free one).")] = DEFAULT_PORT,
    token: Annotated[
        str | None,
        typer.Option(
            help=f"Require this token on every request (or set {TOKEN_ENV}); required when --host is not "
            "a loopback address. Open the printed URL once: the browser then keeps it in a cookie."
        ),
    ] = None,
    refresh_seconds: Annotated[
        float, typer.Option(min=0.1, help="Look for new span files and steps at most this often.")
    ] = 1.0,
    memory_limit: Annotated[str, typer.Option(help="DuckDB memory limit of the app's index.")] = "1GB",
) -> None:
    """Serve a read-only web page over a run: training metrics as plots, the rollouts (paged, sortable,
    filtered, searchable), one rollout's span timeline, messages and reward landings, each trajectory
    token by token (trained mask, sampler logprob, advantage, splits, re-tokenised calls), and the
    build report. A live run's new rollouts and steps appear without a restart. Nothing is written to
    the run folder and nothing is fetched from the network."""
    from rich.console import Console

    console = Console(stderr=True)
    token = token or os.environ.get(TOKEN_ENV) or None
    if not is_loopback(host) and token is None:
        raise typer.BadParameter(
            f"listening on {host} (not loopback) needs --token (or {TOKEN_ENV}): span text is training data",
            param_hint="--host",
        )
    folders = paths or [Path.cwd()]
    missing = [str(p) for p in folders if not p.exists()]
    if missing:
        raise typer.BadParameter(f"{', '.join(missing)} does not exist", param_hint="PATHS")

    from tinkertrace.ui.server import serve

    serve(
        folders,
        host=host,
        port=port,
        token=token,
        refresh_s=refresh_seconds,
        memory_limit=memory_limit,
        console=console,
    )


def register(app: typer.Typer) -> None:
    """Add `tinkertrace ui` to the main app."""
    app.command("ui")(needs_extra("ui", "ui")(ui))
