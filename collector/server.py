"""Run the collector: recover the WAL, serve OTLP/HTTP and OTLP/gRPC, flush everything on shutdown."""

from __future__ import annotations

import gc
import logging
import os
import resource
import signal
import sys
import threading
import time
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING

from tinkertrace.collector.ingest import IngestConfig, Ingestor, RecoveryReport
from tinkertrace.collector.settings import CollectorSettings
from tinkertrace.spanstore.convert import compiled_decoder, warm_up_kernels
from tinkertrace.spanstore.logs import LOGS_FOLDER, convert_logs

if TYPE_CHECKING:
    import grpc

    from tinkertrace.collector.http_server import HttpServer

FILES_RESERVED = 256  # descriptors kept for the WAL, Parquet files, gRPC and the runtime


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (where allowed); returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft if soft != resource.RLIM_INFINITY else 1 << 20
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft
    return target


def connection_cap(wanted: int, open_files: int) -> int:
    """The HTTP connection cap: ``wanted``, lowered so that the connections leave FILES_RESERVED
    descriptors under the open-files limit (at least 8)."""
    return max(8, min(wanted, open_files - FILES_RESERVED))


def _prepare_converter() -> None:
    """Compile (first start after an install, ~15 s) or load the kernels of the compiled decoder and of
    the list splice's page gather."""
    if compiled_decoder() is None:
        print(
            "tinkertrace collector: numba is not installed, so spans are converted by the reference decoder "
            "(about 3.5x more CPU per span); pip install 'tinkertrace[collector]' for the compiled one",
            flush=True,
        )
        return
    started = time.monotonic()
    warm_up_kernels()
    if time.monotonic() - started > 2:
        print(
            f"tinkertrace collector: compiled the span-scan kernels in {time.monotonic() - started:.0f}s "
            "(cached for later starts)",
            flush=True,
        )


def run_collector(config: CollectorSettings) -> int:
    """Serve until SIGINT/SIGTERM; returns the process exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not (config.http or config.grpc):
        print("error: both OTLP/HTTP and OTLP/gRPC are turned off; nothing to serve", file=sys.stderr)
        return 2
    open_files = raise_open_files_limit()
    max_connections = connection_cap(config.max_connections, open_files)
    ingestor, logs = _make_ingestor(config), _make_logs_ingestor(config)
    _prepare_converter()
    _report_recovery(ingestor.recover())
    _report_recovery(logs.recover(), "log records")
    gc.freeze()  # start-up objects (modules, compiled kernels) are not garbage: keep them out of GC passes
    ingestor.start()
    logs.start()
    stop = _stop_on_signals()
    try:
        servers = _start_servers(config, ingestor, max_connections, logs)
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        ingestor.stop()
        logs.stop()
        return 1
    _announce(config, ingestor, f"up to {max_connections} HTTP connections, open-files limit {open_files}")
    while not stop.wait(SIGNAL_POLL_S):
        pass
    print("tinkertrace collector: shutting down, flushing spans…", flush=True)
    servers.stop()
    ingestor.stop()
    logs.stop()
    print(
        f"tinkertrace collector: stopped; {ingestor.stats['spans']} spans accepted, "
        f"{ingestor.writer.rows_written} rows written to {len(ingestor.writer.files_written)} file(s); "
        f"{logs.stats['spans']} log records accepted",
        flush=True,
    )
    return 1 if ingestor.failure or logs.failure else 0


def _make_ingestor(config: CollectorSettings) -> Ingestor:
    out = config.out.resolve()
    instance = config.resolved_instance()
    return Ingestor(
        IngestConfig(
            out=out,
            wal_dir=(config.wal_dir or out / "_wal" / instance).resolve(),
            instance=instance,
            max_queue_bytes=config.max_queue_bytes,
            max_file_bytes=config.max_file_bytes,
            roll_seconds=config.roll_seconds,
            zstd_level=config.zstd_level,
        )
    )


LOGS_QUEUE_SHARE = 8  # the log ingestor's memory budget: this fraction of the spans'


def _make_logs_ingestor(config: CollectorSettings) -> Ingestor:
    """The OTLP logs' own durable path: its WAL beside the spans' one, Parquet under ``<out>/_logs``."""
    out = config.out.resolve()
    instance = config.resolved_instance()
    spans_wal = (config.wal_dir or out / "_wal" / instance).resolve()
    return Ingestor(
        IngestConfig(
            out=out / LOGS_FOLDER,
            wal_dir=spans_wal.with_name(spans_wal.name + "-logs"),
            instance=instance,
            max_queue_bytes=max(1 << 20, config.max_queue_bytes // LOGS_QUEUE_SHARE),
            max_file_bytes=config.max_file_bytes,
            roll_seconds=config.roll_seconds,
            zstd_level=config.zstd_level,
            convert=convert_logs,
        )
    )


def _report_recovery(recovered: RecoveryReport, what: str = "spans") -> None:
    if recovered.segments:
        print(
            f"tinkertrace collector: recovered {recovered.spans} {what} from {recovered.records} WAL records "
            f"in {recovered.segments} segment(s) (replaced {recovered.files_replaced} partial file(s))",
            flush=True,
        )
    for note in recovered.notes:
        print(f"tinkertrace collector: {note}", flush=True)


SIGNAL_POLL_S = 0.5  # how often the main thread wakes to run a signal handler another thread received


def _stop_on_signals() -> threading.Event:
    """An event set by SIGINT or SIGTERM.

    Python runs signal handlers in the main thread only, and the kernel may deliver a signal to any
    thread (gRPC's, uvicorn's, the writer's): the main thread must wait with a timeout, or a
    SIGTERM that another thread took is never seen (the collector then ran until SIGKILL)."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    return stop


@dataclass
class _Servers:
    """The running transports (either may be off)."""

    grpc: grpc.Server | None = None
    http: HttpServer | None = None

    def stop(self) -> None:
        if self.http is not None:
            self.http.stop()
        if self.grpc is not None:
            self.grpc.stop(grace=5).wait()


def _start_servers(
    config: CollectorSettings, ingestor: Ingestor, max_connections: int, logs: Ingestor | None = None
) -> _Servers:
    """Start OTLP/gRPC and OTLP/HTTP as configured; ``OSError`` (with gRPC stopped) if HTTP cannot."""
    servers = _Servers()
    if config.grpc:
        from tinkertrace.collector.otlp_grpc import start_grpc_server

        servers.grpc = start_grpc_server(
            ingestor,
            config.host,
            config.grpc_port,
            token=config.token,
            max_request_bytes=config.max_request_bytes,
            workers=config.grpc_workers,
            logs=logs,
        )
    if config.http:
        from tinkertrace.collector.http_server import HttpServer
        from tinkertrace.collector.otlp_http import OtlpHttpHandler

        handler = OtlpHttpHandler(
            ingestor, logs=logs, token=config.token, max_request_bytes=config.max_request_bytes
        )
        servers.http = HttpServer(
            handler,
            config.host,
            config.http_port,
            max_body_bytes=config.max_request_bytes,
            max_connections=max_connections,
        )
        try:
            servers.http.start()
        except OSError:
            if servers.grpc is not None:
                servers.grpc.stop(grace=0)
            raise
    return servers


def _announce(config: CollectorSettings, ingestor: Ingestor, limits: str) -> None:
    where = []
    if config.http:
        where.append(f"OTLP/HTTP http://{config.host}:{config.http_port}/v1/traces")
    if config.grpc:
        where.append(f"OTLP/gRPC {config.host}:{config.grpc_port}")
    auth = "bearer token required" if config.token else "no auth"
    print(
        f"tinkertrace collector listening on {', '.join(where)}; writing spans to {ingestor.config.out} "
        f"(WAL {ingestor.config.wal_dir}; {auth}; {limits}; pid {os.getpid()})",
        flush=True,
    )
