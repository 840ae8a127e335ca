"""The settings of `tinkertrace serve` and `tinkertrace proxy`, each declared once.

Light on purpose: the command line imports it to build its help.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tinkertrace.models.builtin import BUILTIN_MODEL
from tinkertrace.serving.policy import INFLIGHT_HELP, InflightMode
from tinkertrace.settings import check_choices, listen_host, listen_port, port_check, raise_problems, setting
from tinkertrace.training.backends import Backend

ToolParserName = Literal["auto", "hermes", "qwen", "none"]  # the choices of serving.tool_parsers
API_KEY_ENV = "TINKERTRACE_API_KEY"
DEFAULT_ROLLOUT_IDLE_S = 3600.0  # a rollout without a call or reward this long is closed as timed_out


@dataclass(kw_only=True)
class RecordingSettings:
    """Whether and where an endpoint records the calls it answers: the options serve and proxy share."""

    collector: str | None = setting(
        None,
        "Record every call served (and the rollout routes' rewards and ends) as spans sent to this collector "
        "(http://host:4318). Spans wait in a spool while it is down.",
    )
    spans_dir: Path | None = setting(
        None, "Record every call served as spans written to this folder (Parquet)."
    )
    spool_dir: Path | None = setting(
        None, "Where spans wait while the collector is down (default under $TINKERTRACE_HOME)."
    )
    record_content: bool = setting(True, "Record the messages of each call (token ids are always recorded).")
    durable: bool = setting(
        True,
        "Answer a call (and a reward or finish) only once its spans are fsynced in the journal, so a crash "
        "loses no answered call; --no-durable answers first (faster; the last moments lost on a crash).",
    )
    journal_dir: Path | None = setting(
        None,
        "The journal (write-ahead log of recorded spans and open rollouts) replayed at the next start "
        "(default: SPANS_DIR/_journal/serve-PORT or proxy-PORT; for a collector only, under SPOOL_DIR).",
    )
    rollout_timeout_s: float = setting(
        DEFAULT_ROLLOUT_IDLE_S,
        "Close a rollout without a call or reward for this many seconds: its rollout span is written with "
        "status timed_out (one driven by the SDK in the agent is forgotten).",
    )

    @property
    def records(self) -> bool:
        return bool(self.collector or self.spans_dir)

    def note(self) -> str:
        """What the start-up line says about recording."""
        targets = " and ".join(str(t) for t in (self.collector, self.spans_dir) if t)
        return f"recording calls to {targets}" if targets else "not recording"


@dataclass(kw_only=True)
class RequestLimitSettings:
    """How much a request may send, and how slowly: the limits serve and proxy share (every route)."""

    max_request_mb: float = setting(
        4.0,
        "Largest request body accepted, in MiB: a larger one gets a 413 before it is read on (never "
        "tokenised, forwarded or recorded).",
    )
    request_timeout: float = setting(
        60.0, "Seconds a client may take to send its request body: a slower one gets a 408."
    )

    def limit_checks(self) -> list[tuple[bool, str]]:
        return [
            (self.max_request_mb > 0, "max_request_mb must be positive"),
            (self.request_timeout > 0, "request_timeout must be positive"),
        ]

    def limits(self) -> Any:
        """The :class:`~tinkertrace.serving.limits.RequestLimits` these settings say."""
        from tinkertrace.serving.limits import MIB, RequestLimits

        return RequestLimits(max_bytes=int(self.max_request_mb * MIB), timeout_s=self.request_timeout)


@dataclass(kw_only=True)
class ServeSettings(RequestLimitSettings, RecordingSettings):
    """The sampling endpoint: which policy, where it listens, how it answers."""

    backend: Backend = setting(
        "local", "Where sampling runs: 'local' (the built-in engine) or 'tinker' (hosted)."
    )
    model: str = setting(
        BUILTIN_MODEL,
        "Base model: 'tinkertrace/tiny-chat' (built in), 'smollm2-135m-instruct' (the smollm2 extra), a "
        ".gguf file, a local Hugging Face folder, or a Tinker model name.",
    )
    host: str = listen_host()
    port: int = listen_port(8000)
    api_key: str | None = setting(
        None, "Require 'Authorization: Bearer KEY' on /v1/* (default: open).", envvar=API_KEY_ENV
    )
    admin_token: str | None = setting(
        None,
        "Enable POST /admin/policy (Bearer TOKEN) so another process can swap weights.",
        envvar="TINKERTRACE_ADMIN_TOKEN",
    )
    model_path: str | None = setting(
        None, "Serve these sampler weights (tinker://.../sampler_weights/...) instead of the base."
    )
    policy_version: int = setting(0, "Policy version reported for the initial weights.")
    inflight: InflightMode = setting("keep-cache", INFLIGHT_HELP)
    watch_checkpoints: Path | None = setting(
        None, "Follow this checkpoint record (LOG_DIR/checkpoints.jsonl) and serve each new entry."
    )
    served_name: list[str] = setting(
        help="Model name clients send in requests (default: --model); repeat for aliases (e.g. the names a "
        "harness asks for): requests naming any of them are served, /v1/models lists each, answers carry "
        "the name the request gave.",
        default_factory=list,
    )
    max_tokens: int = setting(256, "max_tokens for requests that set none.")
    batch_window_ms: float = setting(
        5.0, "How long identical concurrent requests wait to share one sample call (0: off)."
    )
    engine_dir: Path | None = setting(
        None, "Local engine storage folder (default: $TINKERTRACE_HOME/engine)."
    )
    tool_parser: ToolParserName = setting(
        "auto",
        "How tool calls are read from replies into message.tool_calls: 'hermes' (alias 'qwen': "
        '<tool_call>{"name": ..., "arguments": ...}</tool_call>, Hermes/Qwen 2.5/3 and the built-in '
        "model), 'none' (calls stay text), or 'auto': hermes when the chat template writes <tool_call>, "
        "else none.",
    )

    def validate(self) -> ServeSettings:
        """Check ranges and choices; returns self."""
        checks = [
            port_check(self.port),
            (self.max_tokens >= 1, "max_tokens must be at least 1"),
            (self.batch_window_ms >= 0, "batch_window_ms must be 0 or more"),
            *self.limit_checks(),
            *check_choices(self),
        ]
        raise_problems(checks, "invalid serve settings")
        return self


@dataclass(kw_only=True)
class ProxySettings(RequestLimitSettings, RecordingSettings):
    """The recording proxy in front of another OpenAI-compatible server."""

    upstream: str = setting(
        help="The OpenAI-compatible server to pass calls on to, as a base URL ending in /v1 (vLLM, SGLang, a "
        "hosted endpoint, tinkertrace serve)."
    )
    host: str = listen_host()
    port: int = listen_port(8010)
    api_key: str | None = setting(
        None,
        "Require 'Authorization: Bearer KEY' from agents (default: open). Also guards the reward and finish "
        "routes.",
        envvar=API_KEY_ENV,
    )
    upstream_api_key: str | None = setting(
        None,
        "The key sent to the upstream (default: the agent's own Authorization header, unless --api-key is "
        "set).",
        envvar="TINKERTRACE_UPSTREAM_API_KEY",
    )
    timeout: float = setting(600.0, "Seconds to wait for the upstream's answer.")

    def validate(self) -> ProxySettings:
        """Check the upstream URL and ranges; returns self."""
        checks = [
            (
                self.upstream.startswith(("http://", "https://")),
                "upstream must be an http(s) URL such as http://127.0.0.1:8000/v1",
            ),
            port_check(self.port),
            (self.timeout > 0, "timeout must be positive"),
            *self.limit_checks(),
        ]
        raise_problems(checks, "invalid proxy settings")
        return self
