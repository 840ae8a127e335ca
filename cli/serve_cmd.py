"""`tinkertrace serve`: the OpenAI-compatible sampling endpoint over the local engine or Tinker."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tinkertrace.builtin import BUILTIN_MODEL

BACKENDS = ("local", "tinker")  # as tinkertrace.training.backends.BACKENDS (imported lazily)


def _tokenizer(backend: str, model: str, sampling_client: Any) -> Any:
    """The model's tokenizer: built in or a local folder; Tinker's own for hosted model names."""
    from tinkertrace.tokenizer import TokenizerNotFoundError, load_tokenizer

    try:
        return load_tokenizer(model)
    except TokenizerNotFoundError:
        if backend == "local":
            raise
        return sampling_client.get_tokenizer()


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
    """
    if backend not in BACKENDS:
        raise typer.BadParameter(f"must be one of {', '.join(BACKENDS)}", param_hint="--backend")
    from tinkertrace.serving.tool_parsers import TOOL_PARSERS

    if tool_parser not in TOOL_PARSERS:
        raise typer.BadParameter(f"must be one of {', '.join(TOOL_PARSERS)}", param_hint="--tool-parser")
    import uvicorn
    from rich.console import Console

    from tinkertrace.serving.app import create_app
    from tinkertrace.serving.policy import PolicyHolder, resolve_client
    from tinkertrace.training.backends import make_service_client
    from tinkertrace.training.errors import TrainingError

    console = Console(stderr=True)
    try:
        service = make_service_client(backend, engine_dir=engine_dir)
        if model_path:
            sampling_client = resolve_client(service.create_sampling_client(model_path=model_path))
        else:
            sampling_client = resolve_client(service.create_sampling_client(base_model=model))
        tokenizer = _tokenizer(backend, model, sampling_client)
    except (TrainingError, OSError, ValueError) as exc:  # BackendError, missing model/checkpoint, ...
        console.print(f"[red]tinkertrace serve: cannot start[/]: {exc}")
        raise typer.Exit(1) from None
    holder = PolicyHolder(
        sampling_client,
        tokenizer,
        served_name or model,
        version=policy_version,
        model_path=model_path,
        loader=lambda path: service.create_sampling_client(model_path=path),
    )
    app = create_app(
        holder,
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
            "up from --watch-checkpoints or POST /admin/policy (with --admin-token)."
        ),
    )(serve)
