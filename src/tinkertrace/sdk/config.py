"""SDK configuration: ``init()`` arguments merged over ``TINKERTRACE_*`` environment variables, each
setting declared once (:mod:`tinkertrace.settings`)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tinkertrace.settings import load, setting

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

Messages = list[dict[str, Any]]
Redactor = Callable[[Messages], Messages]

ENV_HOME = "TINKERTRACE_HOME"
DEFAULT_SPANS_DIR = "spans"
Protocol = Literal["http", "grpc"]


@dataclass(frozen=True)
class TraceSettings:
    """The resolved SDK configuration: each field an argument of :func:`tinkertrace.init`, the documented
    ones also set by their environment variable (an argument wins)."""

    endpoint: str | None = setting(
        None,
        "OTLP endpoint: http://host:4318 for HTTP/protobuf, host:4317 with protocol grpc.",
        envvar="TINKERTRACE_ENDPOINT",
    )
    spans_dir: Path | None = setting(
        None,
        "A folder the embedded Parquet sink writes to (the parquet extra). With neither this nor an "
        "endpoint, spans go to ./spans.",
        envvar="TINKERTRACE_SPANS_DIR",
    )
    protocol: Protocol = setting(
        "http", "OTLP protocol: http or grpc (the grpc extra).", envvar="TINKERTRACE_PROTOCOL"
    )
    service_name: str = setting(
        "tinkertrace-agent", "The service.name resource of the spans.", envvar="TINKERTRACE_SERVICE_NAME"
    )
    capture_content: bool = setting(True, "Record messages.", envvar="TINKERTRACE_CAPTURE_CONTENT")
    request_token_ids: bool = setting(
        True,
        "Ask servers for token ids and logprobs inside rollouts.",
        envvar="TINKERTRACE_REQUEST_TOKEN_IDS",
    )
    tokenizer: str | None = setting(
        None,
        "Re-tokenise when the server returns no ids (a name or folder tinkertrace.models.tokenizer loads).",
        envvar="TINKERTRACE_TOKENIZER",
    )
    redact: Redactor | None = None
    spool_dir: Path | None = setting(
        None,
        "Where undeliverable OTLP batches wait (default $TINKERTRACE_HOME/spool/<endpoint hash>).",
        envvar="TINKERTRACE_SPOOL_DIR",
    )
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


def tinkertrace_home() -> Path:
    """``$TINKERTRACE_HOME``, default ``~/.cache/tinkertrace``."""
    return Path(os.environ.get(ENV_HOME) or Path.home() / ".cache" / "tinkertrace")


def resolve(**given: Any) -> TraceSettings:
    """Merge explicit ``init()`` arguments (``None`` = not given) over the environment and defaults."""
    unknown = set(given) - {f.name for f in fields(TraceSettings)}
    if unknown:
        raise TypeError(f"unknown tinkertrace.init() option(s): {', '.join(sorted(unknown))}")
    config = load(TraceSettings, given=given, what="tinkertrace.init() argument")
    if config.endpoint is None and config.spans_dir is None:
        config = replace(config, spans_dir=Path(DEFAULT_SPANS_DIR))
    if config.spool_dir is None and config.endpoint is not None:
        digest = hashlib.sha1(f"{config.protocol}:{config.endpoint}".encode()).hexdigest()[:12]
        config = replace(config, spool_dir=tinkertrace_home() / "spool" / digest)
    return config
