"""``init`` / ``shutdown`` / ``flush`` / ``stats``: the process-wide tracing runtime.

tinkertrace keeps its own ``TracerProvider`` and never replaces the global one, so it coexists with
an application's own OpenTelemetry set-up (spans still nest: parents come from the shared context).
That provider records even under ``OTEL_SDK_DISABLED=true`` (see :class:`TrainingDataProvider`).
Its spans go through one ``BatchSpanProcessor`` per exporter (see :mod:`.export`). Instrumentations
(the LLM-call capture) register themselves with :func:`register_instrumentation`; the runtime
installs them at ``init()`` and removes them at ``shutdown()``.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, SynchronousMultiSpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from tinkertrace.sdk import config as cfg
from tinkertrace.sdk import context
from tinkertrace.sdk.export import TrainingDataProcessor
from tinkertrace.sdk.refusals import RefusedEndpoints
from tinkertrace.sdk.stats import ExportStats

log = logging.getLogger("tinkertrace")

SCOPE_NAME = "tinkertrace.sdk"


@dataclass(frozen=True)
class Instrumentation:
    """What ``init()`` installs (when ``enabled(config)``) and ``shutdown()`` removes."""

    enabled: Callable[[cfg.TraceSettings], bool]
    install: Callable[[], object]
    uninstall: Callable[[], None]


_instrumentations: list[Instrumentation] = []


def register_instrumentation(instrumentation: Instrumentation) -> None:
    """Have every later ``init()`` install ``instrumentation`` (the LLM-call capture registers so)."""
    _instrumentations.append(instrumentation)


@dataclass
class Runtime:
    """What ``init()`` set up; replaced as a whole by the next ``init()``."""

    config: cfg.TraceSettings
    provider: TracerProvider
    tracer: trace.Tracer
    processor: SynchronousMultiSpanProcessor  # every span processor, for spans made without the tracer
    pipelines: Sequence[TrainingDataProcessor]  # one per SDK exporter: the training data
    stock_pipelines: Sequence[BatchSpanProcessor]  # one per exporter passed to init(exporters=...)
    stats: ExportStats
    scope: InstrumentationScope
    refused_endpoints: RefusedEndpoints
    _tokenizer: Any = None
    _tokenizer_failed: bool = False

    def tokenizer(self) -> Any:
        """The configured tokenizer (loaded on first use), or None."""
        if self._tokenizer is None and self.config.tokenizer and not self._tokenizer_failed:
            try:
                from tinkertrace.extras import require

                require("build", f"re-tokenising with tokenizer {self.config.tokenizer!r}")
                from tinkertrace.models.tokenizer import load_tokenizer

                self._tokenizer = load_tokenizer(self.config.tokenizer)
            except Exception as exc:
                self._tokenizer_failed = True
                log.warning(
                    "tinkertrace: cannot load tokenizer %r (%s); no re-tokenisation",
                    self.config.tokenizer,
                    exc,
                )
        return self._tokenizer


class TrainingDataProvider(TracerProvider):
    """The SDK's provider. ``OTEL_SDK_DISABLED=true`` turns OpenTelemetry telemetry off (CrewAI tells
    its users to set it to stop its own telemetry); a plain provider would then hand out no-op
    tracers for the rollout, agent and reward spans while LLM spans (built directly) were still
    written: every rollout incomplete, no warning. Training data is what the user asked tinkertrace
    for, so this provider keeps recording and says so once."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self._disabled:
            log.warning(
                "tinkertrace: OTEL_SDK_DISABLED=true turns off OpenTelemetry telemetry, but tinkertrace "
                "keeps recording training data (rollouts, LLM calls, rewards) to its own targets; "
                "remove @traced_rollout / tinkertrace.init() to record nothing"
            )
            self._disabled = False


_lock = threading.RLock()
_runtime: Runtime | None = None
_atexit_registered = False


def init(
    endpoint: str | None = None,
    *,
    spans_dir: str | Path | None = None,
    protocol: str | None = None,
    service_name: str | None = None,
    capture_content: bool | None = None,
    request_token_ids: bool | None = None,
    tokenizer: str | None = None,
    redact: cfg.Redactor | None = None,
    spool_dir: str | Path | None = None,
    headers: dict[str, str] | None = None,
    exporters: Sequence[SpanExporter] = (),
    **options: Any,
) -> cfg.TraceSettings:
    """Configure tracing for this process; calling it again replaces the previous configuration.

    endpoint: OTLP endpoint (``http://host:4318`` for HTTP/protobuf, ``host:4317`` with
    ``protocol="grpc"``). spans_dir: a folder the embedded Parquet sink writes to. Give either or
    both; with neither (and no ``TINKERTRACE_ENDPOINT`` / ``TINKERTRACE_SPANS_DIR``) spans go to
    ``./spans``. capture_content: record messages (default on). request_token_ids: ask servers for
    token ids and logprobs inside rollouts (default on). tokenizer: re-tokenise when the server
    returns no ids (``tinkertrace.models.tokenizer.load_tokenizer`` name or local folder). redact:
    ``redact(messages) -> messages`` applied before messages are recorded. spool_dir: where
    undeliverable OTLP batches wait (default ``$TINKERTRACE_HOME/spool/<endpoint hash>``).
    exporters: more OpenTelemetry ``SpanExporter`` objects (console, Jaeger, Phoenix, a second OTLP
    endpoint...) that receive every span too, each through its own ``BatchSpanProcessor``; they are
    shut down with this configuration. Further options: the fields of
    :class:`~tinkertrace.sdk.config.TraceSettings`.
    """
    config = cfg.resolve(
        endpoint=endpoint,
        spans_dir=spans_dir,
        protocol=protocol,
        service_name=service_name,
        capture_content=capture_content,
        request_token_ids=request_token_ids,
        tokenizer=tokenizer,
        redact=redact,
        spool_dir=spool_dir,
        headers=headers,
        exporters=tuple(exporters),
        **options,
    )
    global _runtime, _atexit_registered
    with _lock:
        if _runtime is not None:
            _shutdown_locked()
        _runtime = _build(config)
        if not _atexit_registered:
            atexit.register(shutdown)
            _atexit_registered = True
    return config


def _own_exporters(config: cfg.TraceSettings, stats: ExportStats) -> list[SpanExporter]:
    exporters: list[SpanExporter] = []
    if config.spans_dir is not None:
        from tinkertrace.extras import require  # here: it reads package metadata (~20 ms)

        require("parquet", "init(spans_dir=...), the embedded Parquet sink,")
        from tinkertrace.sdk.parquet_exporter import ParquetSpanExporter

        exporters.append(ParquetSpanExporter(config.spans_dir, stats))
    if config.otlp_url is not None:
        from tinkertrace.sdk.otlp import OtlpSpoolingExporter

        if config.protocol == "grpc":
            from tinkertrace.extras import require

            require("grpc", "init(protocol='grpc')")
        exporters.append(OtlpSpoolingExporter.from_config(config, stats))
    return exporters


def _scope() -> InstrumentationScope:
    from tinkertrace import __version__  # not importlib.metadata: scanning sys.path costs ~20 ms at init

    return InstrumentationScope(SCOPE_NAME, __version__)


def _build(config: cfg.TraceSettings, sink: SpanProcessor | None = None) -> Runtime:
    """The runtime of ``config``; with ``sink``, spans go to it instead of the SDK's own exporters."""
    stats = ExportStats()
    queue, batch, delay_s = config.max_queue_spans, config.batch_size, config.schedule_delay_s
    pipelines = [
        TrainingDataProcessor(exporter, stats, max_queue=queue, batch_size=batch, schedule_delay_s=delay_s)
        for exporter in (_own_exporters(config, stats) if sink is None else [])
    ]
    stock_pipelines = [
        BatchSpanProcessor(stock, queue, delay_s * 1000, min(batch, queue)) for stock in config.exporters
    ]
    processor = SynchronousMultiSpanProcessor()
    provider = TrainingDataProvider(
        sampler=ALWAYS_ON,
        resource=Resource.create({"service.name": config.service_name}),
        shutdown_on_exit=False,
        active_span_processor=processor,
    )
    for pipeline in (*pipelines, *stock_pipelines, *([sink] if sink is not None else [])):
        provider.add_span_processor(pipeline)
    scope = _scope()
    tracer = provider.get_tracer(scope.name, scope.version)
    refused = RefusedEndpoints(config.token_ids_recheck_calls, config.token_ids_recheck_s)
    runtime = Runtime(config, provider, tracer, processor, pipelines, stock_pipelines, stats, scope, refused)
    for instrumentation in _instrumentations:
        if instrumentation.enabled(config):
            instrumentation.install()
    if config.patch_executors:
        context.patch_executors()
    return runtime


def private_runtime(*, sink: SpanProcessor | None = None, **init_args: Any) -> Runtime:
    """A runtime of its own beside the process's (``init()``'s, untouched): the same exporters and
    pipelines from the same ``init()`` arguments, without HTTP capture or the executor patch; with
    ``sink``, every span goes to that processor alone (the endpoint's journal) instead of the SDK's
    exporters. The sampling endpoint records the calls it serves with one; :func:`close_runtime` ends it."""
    return _build(cfg.resolve(**init_args, capture_http=False, patch_executors=False), sink)


def flush_runtime(runtime: Runtime, timeout_s: float = 30.0) -> bool:
    """Export a :func:`private_runtime`'s finished spans now, as :func:`flush` does for ``init()``'s."""
    return _flush(runtime, timeout_s)


def close_runtime(runtime: Runtime, timeout_s: float = 30.0) -> bool:
    """Flush a :func:`private_runtime` (True when everything reached its targets) and shut it down."""
    ok = _flush(runtime, timeout_s)
    runtime.provider.shutdown()
    return ok


def _shutdown_locked() -> None:
    global _runtime
    runtime, _runtime = _runtime, None
    if runtime is None:
        return
    for instrumentation in _instrumentations:
        instrumentation.uninstall()
    context.unpatch_executors()
    _flush(runtime, 30.0)
    runtime.provider.shutdown()


def shutdown() -> None:
    """Flush everything, close files and connections, remove the HTTP patches. Safe to call twice."""
    with _lock:
        _shutdown_locked()


def flush(timeout_s: float = 30.0) -> bool:
    """Export every finished span now (sink files closed, spooled OTLP batches re-sent).

    True when the training data reached its targets (the embedded sink, the OTLP endpoint); False
    if some batches are still spooled or were refused. Exporters passed to ``init(exporters=...)``
    are flushed too, until the timeout, and do not change the answer.
    """
    runtime = _runtime
    return True if runtime is None else _flush(runtime, timeout_s)


def _flush(runtime: Runtime, timeout_s: float) -> bool:
    """Flush the SDK's exporters, each whatever an earlier one answered, then the stock ones (each
    in a thread, waited for until the deadline: a stuck viewer never holds up the caller longer)."""
    deadline, ok = time.monotonic() + timeout_s, True
    for pipeline in runtime.pipelines:
        ok = pipeline.force_flush(_ms_left(deadline)) and ok
    flushing = [
        threading.Thread(target=pipeline.force_flush, name="tinkertrace-flush", daemon=True)
        for pipeline in runtime.stock_pipelines
    ]
    for thread in flushing:
        thread.start()
    for thread in flushing:
        thread.join(max(0.0, deadline - time.monotonic()))
    return ok


def _ms_left(deadline: float) -> int:
    return max(0, int((deadline - time.monotonic()) * 1000))


def stats() -> dict[str, int]:
    """Span counts since the last ``init()``: queued, exported, dropped, spooled, resent, rejected."""
    runtime = _runtime
    return {} if runtime is None else runtime.stats.snapshot()


def current() -> Runtime | None:
    """The runtime if ``init()`` ran, else None (never initialises)."""
    return _runtime


def get() -> Runtime:
    """The runtime, initialising from the environment on first use."""
    runtime = _runtime
    if runtime is None:
        with _lock:
            if _runtime is None:
                init()
            runtime = _runtime
    assert runtime is not None
    return runtime
