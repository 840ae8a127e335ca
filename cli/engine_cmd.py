"""`tinkertrace engine`: the local training engine behind Tinker's own REST API."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tinkertrace.cli.extras import needs_extra

HELP = (
    "Serve the local training engine over Tinker's REST API, so the unchanged tinker SDK trains here.\n\n"
    "Point any Tinker program at it: TINKER_BASE_URL=http://127.0.0.1:8100 TINKER_API_KEY=tml-local "
    "(or tinker.ServiceClient(base_url=..., api_key=...)); `tinkertrace train --backend tinker` and "
    "`tinkertrace serve --backend tinker` then run against this machine. Serves the built-in model "
    "(tinkertrace/tiny-chat[:nano|:small|:base]), smollm2-135m-instruct, any .gguf file or local Hugging "
    "Face folder, LoRA and full fine-tuning; checkpoints are tinker:// paths under --dir. --model-alias "
    "lets recipes' model names (e.g. Qwen/Qwen3-8B-Base) run on a local model. Refused and failed calls "
    "are logged, one line each (route, status, reason). See docs/engine.md."
)


def parse_aliases(pairs: list[str]) -> dict[str, str]:
    """``NAME=MODEL`` options → ``{NAME: MODEL}``; ValueError naming a malformed one."""
    aliases = {}
    for pair in pairs:
        name, sep, target = pair.partition("=")
        if not sep or not name.strip() or not target.strip():
            raise ValueError(
                f"--model-alias {pair!r} must look like NAME=MODEL (e.g. Qwen/Qwen3-8B=tinkertrace/tiny-chat)"
            )
        aliases[name.strip()] = target.strip()
    return aliases


def _check_model(name: str) -> None:
    """ModelNotFoundError unless ``name`` is a built-in model, a packaged or GGUF model, or a Hugging Face
    model folder."""
    from tinkertrace.engine.model import ModelNotFoundError, builtin_size
    from tinkertrace.models import model_folder

    if builtin_size(name) is None and not (model_folder(name) / "config.json").is_file():
        raise ModelNotFoundError(f"{name!r} is not a Hugging Face model folder (no config.json)")


def _configure_logging() -> None:
    """The request log on stderr (one line per refused or failed call), no Hugging Face progress bars."""
    import logging
    import os

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s tinkertrace engine %(levelname)s: %(message)s"))
    logger = logging.getLogger("tinkertrace.engine")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def engine(
    port: Annotated[int, typer.Option(help="TCP port to listen on.")] = 8100,
    host: Annotated[
        str, typer.Option(help="Address to bind (loopback by default; 0.0.0.0 exposes it to the network).")
    ] = "127.0.0.1",
    engine_dir: Annotated[
        Path | None,
        typer.Option(
            "--dir",
            help="Checkpoint folder (tinker://<run>/... paths live here; default $TINKERTRACE_HOME/engine).",
        ),
    ] = None,
    model: Annotated[
        list[str] | None,
        typer.Option(
            help="A model to list in get_server_capabilities: a local Hugging Face folder, a .gguf file, "
            "smollm2-135m-instruct or a built-in name; "
            "repeat for several. Checked at start. Any built-in size or local folder can be trained anyway."
        ),
    ] = None,
    model_alias: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME=MODEL: serve requests for model NAME (e.g. a recipe's Qwen/Qwen3-8B-Base) with MODEL "
            "(a built-in name or a local folder); repeat for several. Runs keep the name they were asked for."
        ),
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="TINKERTRACE_ENGINE_API_KEY",
            help="Accept exactly this X-API-Key (default: any key that starts with 'tml-').",
        ),
    ] = None,
    device: Annotated[
        str | None, typer.Option(help="torch device (default: cuda when available, else cpu).")
    ] = None,
    session_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds without a heartbeat after which a session's models are released (the SDK "
            "sends one every 10 s; checkpoints stay)."
        ),
    ] = 600.0,
    cpu_threads: Annotated[
        int | None,
        typer.Option(help="torch CPU threads (default: $TINKERTRACE_CPU_THREADS, else torch's own)."),
    ] = None,
) -> None:
    """Serve the local engine over Tinker's REST API (see the command help)."""
    import uvicorn
    from rich.console import Console

    from tinkertrace.engine import ServiceClient
    from tinkertrace.engine.model import ModelNotFoundError
    from tinkertrace.engine_server import EngineSettings, create_app

    console = Console(stderr=True, soft_wrap=True)
    models = list(model or [])
    try:
        aliases = parse_aliases(list(model_alias or []))
        for name in [*models, *aliases.values()]:
            _check_model(name)
    except (ModelNotFoundError, ValueError) as exc:
        console.print(f"[red]tinkertrace engine: cannot start[/]: {exc}")
        raise typer.Exit(1) from None
    if api_key is not None and not api_key.startswith("tml-"):
        console.print(
            "[red]tinkertrace engine: cannot start[/]: --api-key must start with 'tml-' (the SDK's rule)"
        )
        raise typer.Exit(1)
    _configure_logging()
    service = ServiceClient(base_dir=engine_dir, device=device, cpu_threads=cpu_threads)
    settings = EngineSettings(
        api_key=api_key, models=models, session_timeout_s=session_timeout, model_aliases=aliases
    )
    app = create_app(service, settings)
    key_hint = "<the --api-key value>" if api_key else "tml-local"
    console.print(
        f"[bold]tinkertrace engine[/]: Tinker API at [green]http://{host}:{port}[/] "
        f"(device {service.device}, checkpoints in {service.store.base_dir}; "
        f"API key {'as given' if api_key else 'any tml-...'}). Use it with "
        f"TINKER_BASE_URL=http://{host}:{port} TINKER_API_KEY={key_hint}. Ctrl-C stops."
    )
    for name, target in aliases.items():
        console.print(f"  model alias: {name} → {target}")
    uvicorn.run(app, host=host, port=port, log_level="warning")


def register(app: typer.Typer) -> None:
    """Add `tinkertrace engine` to the main app."""
    app.command("engine", help=HELP)(needs_extra("engine", "engine")(engine))
