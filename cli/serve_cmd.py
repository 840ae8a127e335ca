"""`tinkertrace serve`: the OpenAI-compatible sampling endpoint over the local engine or Tinker."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tinkertrace.cli.extras import needs_extra
from tinkertrace.cli.options import OptionsOf, config_option, validated, with_settings
from tinkertrace.serving.settings import RecordingSettings, ServeSettings


def make_recorder(recording: RecordingSettings, name: str) -> Any:
    """A :class:`~tinkertrace.serving.recording.CallRecorder` when --collector or --spans-dir is given
    (``name``: the command and its port, e.g. ``serve-8000``, which name its default journal folder)."""
    if not recording.records:
        return None
    from tinkertrace.serving.recording import CallRecorder

    return CallRecorder(
        collector=recording.collector,
        spans_dir=recording.spans_dir,
        spool_dir=recording.spool_dir,
        journal_dir=recording.journal_dir,
        name=name,
        capture_content=recording.record_content,
        durable=recording.durable,
        rollout_idle_s=recording.rollout_timeout_s,
    )


@with_settings
def serve(
    settings: dict[str, Any] = OptionsOf(ServeSettings),
    config: Annotated[Path | None, config_option(ServeSettings, section="serve")] = None,
) -> None:
    """Serve the policy over an OpenAI-compatible API (see the command help)."""
    run = validated(ServeSettings, settings, config, section="serve")
    import uvicorn
    from rich.console import Console

    from tinkertrace.serving.app import create_app
    from tinkertrace.serving.policy import policy_from_service
    from tinkertrace.settings import UserError
    from tinkertrace.training.backends import close_service, make_service_client

    console = Console(stderr=True)
    try:
        service = make_service_client(run.backend, engine_dir=run.engine_dir)
        holder = policy_from_service(
            service,
            run.model,
            model_path=run.model_path,
            served_name=run.served_name,
            version=run.policy_version,
            inflight=run.inflight,
        )
    except (UserError, OSError, ValueError) as exc:  # BackendError, missing model/checkpoint, ...
        console.print(f"[red]tinkertrace serve: cannot start[/]: {exc}")
        raise typer.Exit(1) from None
    app = create_app(
        holder,
        recorder=make_recorder(run, f"serve-{run.port}"),
        api_key=run.api_key,
        admin_token=run.admin_token,
        default_max_tokens=run.max_tokens,
        batch_window_s=run.batch_window_ms / 1000,
        watch_checkpoints=run.watch_checkpoints,
        tool_parser=run.tool_parser,
        limits=run.limits(),
    )
    parser = app.state.endpoint.tool_parser
    extras = [
        f"API key {'required' if run.api_key else 'not required'}",
        f"admin API {'on' if run.admin_token else 'off'}",
        f"tool parser {parser.name if parser else 'none'}",
    ]
    if run.watch_checkpoints:
        extras.append(f"following {run.watch_checkpoints}")
    extras.append(run.note())
    console.print(
        f"[bold]tinkertrace serve[/]: [cyan]{holder.model_name}[/] (backend {run.backend}, policy "
        f"v{holder.version}) at [green]http://{run.host}:{run.port}/v1[/] — {', '.join(extras)}. "
        "Ctrl-C stops."
    )
    try:
        uvicorn.run(app, host=run.host, port=run.port, log_level="warning")
    finally:  # in order: the app has shut down (recorder flushed); now the sampler, then the session
        holder.close()
        close_service(service)


def register(app: typer.Typer) -> None:
    """Add `tinkertrace serve` to the main app."""
    app.command(
        "serve",
        help=(
            "Serve the policy over an OpenAI-compatible API (/v1/chat/completions, /v1/responses, "
            "/v1/completions, /v1/models).\n\nEvery answer carries prompt_token_ids, "
            "choices[].token_ids (output_token_ids on /v1/responses), logprobs when asked, and the "
            "policy version that sampled it. Tool calls in replies come back as structured tool_calls "
            "(function_call items on /v1/responses), read by --tool-parser. New weights are picked "
            "up from --watch-checkpoints or POST /admin/policy (with --admin-token).\n\n"
            "With --collector or --spans-dir the endpoint records every call it serves as a token-exact "
            "LLM span: rollouts are named by a URL prefix (base URL http://HOST:PORT/rollouts/ID/v1), "
            "x-tinkertrace-* headers or a W3C traceparent, and POST /v1/rollouts/ID/reward and "
            "/v1/rollouts/ID/finish record rewards and rollout ends (they need --api-key when one is set)."
        ),
    )(needs_extra("serve", "serve")(serve))
