"""The settings of ``tinkertrace engine``, each declared once (the command's options come from them).

Light on purpose: the command line imports it to build its help.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tinkertrace.settings import listen_host, listen_port, port_check, raise_problems, setting

RETRIEVE_POLL_S = 20.0
"""How long one ``retrieve_future`` call waits for a result before answering ``try_again`` (the SDK
gives each call 45 s)."""
CHECKPOINT_SWEEP_S = 60.0
"""How often expired checkpoints (saved with a TTL) are deleted."""


@dataclass
class EngineSettings:
    """Where the engine listens, what it serves, how it authenticates and when it lets go."""

    port: int = listen_port(8100)
    host: str = listen_host()
    engine_dir: Path | None = setting(
        None,
        "Checkpoint folder (tinker://<run>/... paths live here; default $TINKERTRACE_HOME/engine).",
        flags=("--dir",),
    )
    models: list[str] = setting(
        help="A model to list in get_server_capabilities: a local Hugging Face folder, a .gguf file, "
        "smollm2-135m-instruct or a built-in name; repeat for several. Checked at start. Any built-in size "
        "or local folder can be trained anyway.",
        flags=("--model",),
        default_factory=list,
    )
    model_aliases: dict[str, str] = setting(
        help="NAME=MODEL: serve requests for model NAME (e.g. a recipe's Qwen/Qwen3-8B-Base) with MODEL (a "
        "built-in name or a local folder); repeat for several. Runs keep the name they were asked for.",
        flags=("--model-alias",),
        default_factory=dict,
    )
    api_key: str | None = setting(
        None,
        "Accept exactly this X-API-Key (default: any key that starts with 'tml-').",
        envvar="TINKERTRACE_ENGINE_API_KEY",
    )
    device: str | None = setting(None, "torch device (default: cuda when available, else cpu).")
    session_timeout_s: float = setting(
        600.0,
        "Seconds without a heartbeat after which a session's models are released (the SDK sends one every "
        "10 s; checkpoints stay).",
        flags=("--session-timeout",),
    )
    cpu_threads: int | None = setting(
        None, "torch CPU threads (default: $TINKERTRACE_CPU_THREADS, else torch's own)."
    )
    retrieve_poll_s: float = setting(RETRIEVE_POLL_S)
    checkpoint_sweep_s: float = setting(CHECKPOINT_SWEEP_S)

    def validate(self) -> EngineSettings:
        """Check the key's form and ranges; returns self."""
        checks = [
            (
                self.api_key is None or self.api_key.startswith("tml-"),
                "api_key must start with 'tml-' (the SDK's rule)",
            ),
            port_check(self.port),
            (self.session_timeout_s > 0, "session_timeout_s must be positive"),
        ]
        raise_problems(checks, "invalid engine settings")
        return self
