"""SDK configuration: ``init()`` arguments merged over ``TINKERTRACE_*`` environment variables."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

Messages = list[dict[str, Any]]
Redactor = Callable[[Messages], Messages]

ENV_ENDPOINT = "TINKERTRACE_ENDPOINT"
ENV_SPANS_DIR = "TINKERTRACE_SPANS_DIR"
ENV_PROTOCOL = "TINKERTRACE_PROTOCOL"
ENV_SERVICE_NAME = "TINKERTRACE_SERVICE_NAME"
ENV_CAPTURE_CONTENT = "TINKERTRACE_CAPTURE_CONTENT"
ENV_TOKENIZER = "TINKERTRACE_TOKENIZER"
ENV_REQUEST_TOKEN_IDS = "TINKERTRACE_REQUEST_TOKEN_IDS"
ENV_SPOOL_DIR = "TINKERTRACE_SPOOL_DIR"
ENV_HOME = "TINKERTRACE_HOME"
DEFAULT_SPANS_DIR = "spans"
PROTOCOLS = ("http", "grpc")


@dataclass(frozen=True)
class TraceConfig:
    """The resolved SDK configuration (see :func:`tinkertrace.init` for each field)."""

    endpoint: str | None = None
    spans_dir: Path | None = None
    protocol: str = "http"
    service_name: str = "tinkertrace-agent"
    capture_content: bool = True
    request_token_ids: bool = True
    tokenizer: str | None = None
    redact: Redactor | None = None
    spool_dir: Path | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    exporters: tuple[SpanExporter, ...] = ()  # stock exporters that receive every span too
    capture_http: bool = True
    token_ids_recheck_calls: int = 100  # a host that refused the token-id fields is asked again after
    token_ids_recheck_s: float = 600.0  # ... this many calls to it or this many seconds
    patch_executors: bool = True
    max_queue_spans: int = 65_536
    batch_size: int = 512
    schedule_delay_s: float = 0.5
    export_timeout_s: float = 5.0
    retry_interval_s: float = 2.0

    @property
    def otlp_url(self) -> str | None:
        """Where spans are sent: ``http(s)://host:port/v1/traces`` for HTTP, ``host:port`` for gRPC."""
        if not self.endpoint:
            return None
        url = self.endpoint.rstrip("/")
        if self.protocol == "grpc":
            return url.split("://", 1)[-1]
        if "://" not in url:
            url = "http://" + url
        return url if url.endswith("/v1/traces") else url + "/v1/traces"


def _env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return default
    if value.strip().lower() in ("1", "true", "yes", "on"):
        return True
    if value.strip().lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={value!r}: expected one of 1/0, true/false, yes/no, on/off")


def tinkertrace_home() -> Path:
    """``$TINKERTRACE_HOME``, default ``~/.cache/tinkertrace``."""
    return Path(os.environ.get(ENV_HOME) or Path.home() / ".cache" / "tinkertrace")


def resolve(**given: Any) -> TraceConfig:
    """Merge explicit ``init()`` arguments (``None`` = not given) over the environment and defaults."""
    args = {k: v for k, v in given.items() if v is not None}
    env = os.environ
    endpoint = args.pop("endpoint", None) or env.get(ENV_ENDPOINT) or None
    spans_dir = args.pop("spans_dir", None) or env.get(ENV_SPANS_DIR) or None
    if endpoint is None and spans_dir is None:
        spans_dir = DEFAULT_SPANS_DIR
    protocol = (args.pop("protocol", None) or env.get(ENV_PROTOCOL) or "http").lower()
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol {protocol!r} is not supported: use one of {', '.join(PROTOCOLS)}")
    values: dict[str, Any] = {
        "endpoint": endpoint,
        "spans_dir": Path(spans_dir) if spans_dir else None,
        "protocol": protocol,
        "service_name": args.pop("service_name", None) or env.get(ENV_SERVICE_NAME) or "tinkertrace-agent",
        "capture_content": args.pop("capture_content", _env_bool(ENV_CAPTURE_CONTENT, True)),
        "request_token_ids": args.pop("request_token_ids", _env_bool(ENV_REQUEST_TOKEN_IDS, True)),
        "tokenizer": args.pop("tokenizer", None) or env.get(ENV_TOKENIZER) or None,
    }
    spool = args.pop("spool_dir", None) or env.get(ENV_SPOOL_DIR)
    if spool is None and endpoint is not None:
        digest = hashlib.sha1(f"{protocol}:{endpoint}".encode()).hexdigest()[:12]
        spool = tinkertrace_home() / "spool" / digest
    values["spool_dir"] = Path(spool) if spool else None
    unknown = set(args) - set(TraceConfig.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown tinkertrace.init() option(s): {', '.join(sorted(unknown))}")
    return TraceConfig(**values, **args)
