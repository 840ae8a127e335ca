"""`tinkertrace engine`: the local training engine behind Tinker's own REST API."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from tinkertrace.cli.extras import needs_extra
from tinkertrace.cli.options import OptionsOf, config_option, validated, with_settings
from tinkertrace.engine_server.settings import EngineSettings

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


def _check_model(name: str) -> None:
    """ModelNotFoundError unless ``name`` is a built-in model, a packaged or GGUF model, or a Hugging Face
    model folder."""
    from tinkertrace.engine.model import ModelNotFoundError, builtin_size
    from tinkertrace.models.catalog import model_folder

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


@with_settings
def engine(
    settings: dict[str, Any] = OptionsOf(EngineSettings),
    config: Annotated[Path | None, config_option(EngineSettings, section="engine")] = None,
) -> None:
    """Serve the local engine over Tinker's REST API (see the command help)."""
    run = validated(EngineSettings, settings, config, section="engine")
    import uvicorn
    from rich.console import Console

    from tinkertrace.engine import ServiceClient
    from tinkertrace.engine.model import ModelNotFoundError
    from tinkertrace.engine_server import create_app

    console = Console(stderr=True, soft_wrap=True)
    try:
        for name in [*run.models, *run.model_aliases.values()]:
            _check_model(name)
    except ModelNotFoundError as exc:
        console.print(f"[red]tinkertrace engine: cannot start[/]: {exc}")
        raise typer.Exit(1) from None
    _configure_logging()
    service = ServiceClient(base_dir=run.engine_dir, device=run.device, cpu_threads=run.cpu_threads)
    app = create_app(service, run)
    key_hint = "<the --api-key value>" if run.api_key else "tml-local"
    console.print(
        f"[bold]tinkertrace engine[/]: Tinker API at [green]http://{run.host}:{run.port}[/] "
        f"(device {service.device}, checkpoints in {service.store.base_dir}; "
        f"API key {'as given' if run.api_key else 'any tml-...'}). Use it with "
        f"TINKER_BASE_URL=http://{run.host}:{run.port} TINKER_API_KEY={key_hint}. Ctrl-C stops."
    )
    for name, target in run.model_aliases.items():
        console.print(f"  model alias: {name} → {target}")
    uvicorn.run(app, host=run.host, port=run.port, log_level="warning")


def register(app: typer.Typer) -> None:
    """Add `tinkertrace engine` to the main app."""
    app.command("engine", help=HELP)(needs_extra("engine", "engine")(engine))
