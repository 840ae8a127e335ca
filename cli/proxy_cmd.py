"""`tinkertrace proxy`: record the calls an agent makes to any OpenAI-compatible server."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tinkertrace.cli.extras import needs_extra
from tinkertrace.cli.options import OptionsOf, config_option, validated, with_settings
from tinkertrace.cli.serve_cmd import make_recorder
from tinkertrace.serving.settings import ProxySettings


@with_settings
def proxy(
    settings: dict[str, Any] = OptionsOf(ProxySettings),
    config: Annotated[Path | None, config_option(ProxySettings, section="proxy")] = None,
) -> None:
    """Pass calls on to --upstream and record each as a token-exact LLM span (see docs/serving.md)."""
    run = validated(ProxySettings, settings, config, section="proxy")
    if not run.records:
        raise typer.BadParameter(
            "the proxy records calls: give --collector URL or --spans-dir DIR", param_hint="--collector"
        )
    import uvicorn
    from rich.console import Console

    from tinkertrace.serving.proxy import create_proxy_app

    app = create_proxy_app(
        run.upstream,
        recorder=make_recorder(run, f"proxy-{run.port}"),
        api_key=run.api_key,
        upstream_api_key=run.upstream_api_key,
        timeout_s=run.timeout,
        limits=run.limits(),
    )
    Console(stderr=True).print(
        f"[bold]tinkertrace proxy[/]: [green]http://{run.host}:{run.port}/v1[/] → {run.upstream}, "
        f"{run.note()}, API key {'required' if run.api_key else 'not required'}. Ctrl-C stops."
    )
    uvicorn.run(app, host=run.host, port=run.port, log_level="warning")


def register(app: typer.Typer) -> None:
    """Add `tinkertrace proxy` to the main app."""
    app.command(
        "proxy",
        help=(
            "Record the calls agents make to any OpenAI-compatible server: requests to /v1/* pass on to "
            "--upstream, token ids and logprobs are asked for, and each chat, completions or Responses "
            "call is recorded as a token-exact LLM span (to --collector or --spans-dir) while the answer "
            "streams back unchanged.\n\nRollouts are named as on `tinkertrace serve`: base URL "
            "http://HOST:PORT/rollouts/ID/task/TASK/v1 (task optional), x-tinkertrace-* headers or a W3C "
            "traceparent; POST /v1/rollouts/ID/reward and /v1/rollouts/ID/finish record rewards and "
            "rollout ends."
        ),
    )(needs_extra("serve", "proxy")(proxy))
