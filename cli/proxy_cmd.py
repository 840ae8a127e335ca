"""`tinkertrace proxy`: record the calls an agent makes to any OpenAI-compatible server."""

from __future__ import annotations

from typing import Annotated

import typer

from tinkertrace.cli.extras import needs_extra
from tinkertrace.cli.serve_cmd import (
    CollectorOption,
    RecordContentOption,
    SpansDirOption,
    SpoolDirOption,
    make_recorder,
    recording_note,
)


def proxy(
    upstream: Annotated[
        str,
        typer.Option(
            help="The OpenAI-compatible server to pass calls on to, as a base URL ending in /v1 "
            "(vLLM, SGLang, a hosted endpoint, tinkertrace serve)."
        ),
    ],
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default; 0.0.0.0 exposes it).")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="TCP port to listen on.")] = 8010,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="TINKERTRACE_API_KEY",
            help="Require 'Authorization: Bearer KEY' from agents (default: open). Also guards the reward "
            "and finish routes.",
        ),
    ] = None,
    upstream_api_key: Annotated[
        str | None,
        typer.Option(
            envvar="TINKERTRACE_UPSTREAM_API_KEY",
            help="The key sent to the upstream (default: the agent's own Authorization header, unless "
            "--api-key is set).",
        ),
    ] = None,
    collector: CollectorOption = None,
    spans_dir: SpansDirOption = None,
    spool_dir: SpoolDirOption = None,
    record_content: RecordContentOption = True,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the upstream's answer.")] = 600.0,
) -> None:
    """Pass calls on to --upstream and record each as a token-exact LLM span (see docs/serving.md)."""
    if not upstream.startswith(("http://", "https://")):
        example = "http://127.0.0.1:8000/v1"
        raise typer.BadParameter(f"must be an http(s) URL such as {example}", param_hint="--upstream")
    if not collector and not spans_dir:
        raise typer.BadParameter(
            "the proxy records calls: give --collector URL or --spans-dir DIR", param_hint="--collector"
        )
    import uvicorn
    from rich.console import Console

    from tinkertrace.serving.proxy import create_proxy_app

    recorder = make_recorder(collector, spans_dir, spool_dir, record_content)
    app = create_proxy_app(
        upstream, recorder=recorder, api_key=api_key, upstream_api_key=upstream_api_key, timeout_s=timeout
    )
    Console(stderr=True).print(
        f"[bold]tinkertrace proxy[/]: [green]http://{host}:{port}/v1[/] → {upstream}, "
        f"{recording_note(collector, spans_dir)}, API key {'required' if api_key else 'not required'}. "
        "Ctrl-C stops."
    )
    uvicorn.run(app, host=host, port=port, log_level="warning")


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
