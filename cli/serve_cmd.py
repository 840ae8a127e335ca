"""`tinkertrace serve`: the OpenAI-compatible sampling endpoint over the local engine or Tinker."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tinkertrace.builtin import BUILTIN_MODEL
from tinkertrace.cli.extras import needs_extra

BACKENDS = ("local", "tinker")  # as tinkertrace.training.backends.BACKENDS (imported lazily)


# Recording options, shared with `tinkertrace proxy`.
CollectorOption = Annotated[
    str | None,
    typer.Option(
        help="Record every call served (and the rollout routes' rewards and ends) as spans sent to this "
        "collector (http://host:4318). Spans wait in a spool while it is down.",
    ),
]
SpansDirOption = Annotated[
    Path | None, typer.Option(help="Record every call served as spans written to this folder (Parquet).")
]
SpoolDirOption = Annotated[
    Path | None,
    typer.Option(help="Where spans wait while the collector is down (default under $TINKERTRACE_HOME)."),
]
RecordContentOption = Annotated[
    bool, typer.Option(help="Record the messages of each call (token ids are always recorded).")
]


def make_recorder(
    collector: str | None, spans_dir: Path | None, spool_dir: Path | None, record_content: bool
) -> Any:
    """A :class:`~tinkertrace.serving.recording.CallRecorder` when --collector or --spans-dir is given."""
    if not collector and not spans_dir:
        return None
    from tinkertrace.serving.recording import CallRecorder

    return CallRecorder(
        collector=collector, spans_dir=spans_dir, spool_dir=spool_dir, capture_content=record_content
    )


def recording_note(collector: str | None, spans_dir: Path | None) -> str:
    """What the start-up line says about recording."""
    targets = " and ".join(str(t) for t in (collector, spans_dir) if t)
    return f"recording calls to {targets}" if targets else "not recording"


def serve(
    backend: Annotated[
        str, typer.Option(help="Where sampling runs: 'local' (the built-in engine) or 'tinker' (hosted).")
    ] = "local",
    model: Annotated[
        str,
        typer.Option(
            help="Base model: 'tinkertrace/tiny-chat' (built in), 'smollm2-135m-instruct' (the smollm2 "
            "extra), a .gguf file, a local Hugging Face folder, or a "
            "Tinker model name."
        ),
    ] = BUILTIN_MODEL,
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default; 0.0.0.0 exposes it).")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="TCP port to listen on.")] = 8000,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="TINKERTRACE_API_KEY", help="Require 'Authorization: Bearer KEY' on /v1/* (default: open)."
        ),
    ] = None,
    admin_token: Annotated[
        str | None,
        typer.Option(
            envvar="TINKERTRACE_ADMIN_TOKEN",
            help="Enable POST /admin/policy (Bearer TOKEN) so another process can swap weights.",
        ),
    ] = None,
    model_path: Annotated[
        str | None,
        typer.Option(
            help="Serve these sampler weights (tinker://.../sampler_weights/...) instead of the base."
        ),
    ] = None,
    policy_version: Annotated[int, typer.Option(help="Policy version reported for the initial weights.")] = 0,
    watch_checkpoints: Annotated[
        Path | None,
        typer.Option(
            help="Follow this checkpoint record (LOG_DIR/checkpoints.jsonl) and serve each new entry."
        ),
    ] = None,
    served_name: Annotated[
        str | None, typer.Option(help="Model name clients send in requests (default: --model).")
    ] = None,
    max_tokens: Annotated[int, typer.Option(help="max_tokens for requests that set none.")] = 256,
    batch_window_ms: Annotated[
        float,
        typer.Option(help="How long identical concurrent requests wait to share one sample call (0: off)."),
    ] = 5.0,
    engine_dir: Annotated[
        Path | None,
        typer.Option(help="Local engine storage folder (default: $TINKERTRACE_HOME/engine)."),
    ] = None,
    collector: CollectorOption = None,
    spans_dir: SpansDirOption = None,
    spool_dir: SpoolDirOption = None,
    record_content: RecordContentOption = True,
    tool_parser: Annotated[
        str,
        typer.Option(
            help="How tool calls are read from replies into message.tool_calls: 'hermes' (alias 'qwen': "
            '<tool_call>{"name": ..., "arguments": ...}</tool_call>, Hermes/Qwen 2.5/3 and the built-in '
            "model), 'none' (calls stay text), or 'auto': hermes when the chat template writes "
            "<tool_call>, else none."
        ),
    ] = "auto",
) -> None:
    """Serve the policy over an OpenAI-compatible API (/v1/chat/completions, /v1/responses, /v1/completions,
    /v1/models).

    Every answer carries prompt_token_ids, choices[].token_ids, logprobs when asked, and the policy
    version that sampled it. New weights are picked up from --watch-checkpoints or POST /admin/policy.
    With --collector or --spans-dir every call served is recorded as an LLM span (see docs/serving.md).
    """
    if backend not in BACKENDS:
        raise typer.BadParameter(f"must be one of {', '.join(BACKENDS)}", param_hint="--backend")
    from tinkertrace.serving.tool_parsers import TOOL_PARSERS

    if tool_parser not in TOOL_PARSERS:
        raise typer.BadParameter(f"must be one of {', '.join(TOOL_PARSERS)}", param_hint="--tool-parser")
    import uvicorn
    from rich.console import Console

    from tinkertrace.serving.app import create_app
    from tinkertrace.serving.policy import policy_from_service
    from tinkertrace.training.backends import make_service_client
    from tinkertrace.training.errors import TrainingError

    console = Console(stderr=True)
    try:
        service = make_service_client(backend, engine_dir=engine_dir)
        holder = policy_from_service(
            service, model, model_path=model_path, served_name=served_name, version=policy_version
        )
    except (TrainingError, OSError, ValueError) as exc:  # BackendError, missing model/checkpoint, ...
        console.print(f"[red]tinkertrace serve: cannot start[/]: {exc}")
        raise typer.Exit(1) from None
    recorder = make_recorder(collector, spans_dir, spool_dir, record_content)
    app = create_app(
        holder,
        recorder=recorder,
        api_key=api_key,
        admin_token=admin_token,
        default_max_tokens=max_tokens,
        batch_window_s=batch_window_ms / 1000,
        watch_checkpoints=watch_checkpoints,
        tool_parser=tool_parser,
    )
    parser = app.state.endpoint.tool_parser
    extras = [
        f"API key {'required' if api_key else 'not required'}",
        f"admin API {'on' if admin_token else 'off'}",
        f"tool parser {parser.name if parser else 'none'}",
    ]
    if watch_checkpoints:
        extras.append(f"following {watch_checkpoints}")
    extras.append(recording_note(collector, spans_dir))
    console.print(
        f"[bold]tinkertrace serve[/]: [cyan]{holder.model_name}[/] (backend {backend}, policy "
        f"v{holder.version}) at [green]http://{host}:{port}/v1[/] — {', '.join(extras)}. Ctrl-C stops."
    )
    uvicorn.run(app, host=host, port=port, log_level="warning")


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
