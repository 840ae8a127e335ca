"""The collector's settings, each declared once (``tinkertrace collector`` makes its options from them).

Light on purpose: the command line imports it to build its help; the server imports it to run.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path

from tinkertrace.settings import listen_host, listen_port, port_check, raise_problems, setting
from tinkertrace.spanstore import ZSTD_LEVEL, ZSTD_LEVELS

MiB = 1024 * 1024
TOKEN_ENV = "TINKERTRACE_COLLECTOR_TOKEN"


@dataclass
class CollectorSettings:
    """Where the collector listens, where its files go, and its limits."""

    out: Path = setting(help="Folder the span Parquet files go to (hive date=/hour=).", flags=("--out", "-o"))
    host: str = listen_host()
    http_port: int = listen_port(4318, "OTLP/HTTP port (POST /v1/traces, /v1/logs).")
    grpc_port: int = listen_port(4317, "OTLP/gRPC port (TraceService/Export, LogsService/Export).")
    http: bool = setting(True, "Serve OTLP/HTTP.", flags=("--http/--no-http",))
    grpc: bool = setting(True, "Serve OTLP/gRPC.", flags=("--grpc/--no-grpc",))
    token: str | None = setting(
        None, "Require 'Authorization: Bearer <token>' on every request.", envvar=TOKEN_ENV
    )
    instance: str | None = setting(
        None,
        "Name of this collector in WAL folder and file names; unique per shared --out folder. "
        "Default: <hostname>-<port>.",
    )
    wal_dir: Path | None = setting(None, "Write-ahead log folder. Default: <out>/_wal/<instance>.")
    max_request_mb: float = setting(64.0, "Largest accepted request (after gunzip), MiB; larger → 413.")
    max_queue_mb: float = setting(
        384.0,
        "Memory budget, MiB: request bodies from their head on, their converted spans until they are in a "
        "Parquet file, and the working memory of writing a file (peak RSS: the process at rest + this "
        "+ ~70 MB). At the budget new requests get 429/RESOURCE_EXHAUSTED.",
    )
    max_file_mb: float = setting(
        128.0, "Roll a Parquet file at this much buffered data, MiB (or an eighth of the budget if less)."
    )
    roll_seconds: float = setting(
        30.0, "Roll the WAL segment and write Parquet files at least this often, s."
    )
    max_connections: int = setting(
        1024, "Open HTTP connections before new ones get 503 (lowered to fit the open-files limit; min 8)."
    )
    zstd_level: int = setting(
        ZSTD_LEVEL,
        "zstd level of the Parquet files. 1 is fast; negative levels take less CPU for larger files (-1: "
        "larger token pages on multi-turn rollouts, see benchmarks/NOTES.md). 'tinkertrace spans "
        "compact --zstd-level' can recompress closed hours harder.",
    )
    grpc_workers: int = setting(8)  # gRPC server threads (internal)

    @property
    def max_request_bytes(self) -> int:
        return int(self.max_request_mb * MiB)

    @property
    def max_queue_bytes(self) -> int:
        return int(self.max_queue_mb * MiB)

    @property
    def max_file_bytes(self) -> int:
        return int(self.max_file_mb * MiB)

    def resolved_instance(self) -> str:
        """The instance name: as given, else ``<hostname>-<port>``, made safe for file names."""
        port = (self.http_port if self.http else None) or (self.grpc_port if self.grpc else None) or 0
        raw = self.instance or f"{socket.gethostname()}-{port}"
        return re.sub(r"[^A-Za-z0-9_.]+", "_", raw)

    def validate(self) -> CollectorSettings:
        """Check ranges; returns self."""
        low, high = ZSTD_LEVELS
        checks = [
            (self.http or self.grpc, "both OTLP/HTTP and OTLP/gRPC are turned off; nothing to serve"),
            port_check(self.http_port, self.grpc_port),
            (min(self.max_request_mb, self.max_queue_mb, self.max_file_mb) > 0, "sizes must be positive"),
            (self.roll_seconds > 0, "roll_seconds must be positive"),
            (self.max_connections >= 8, "max_connections must be at least 8"),
            (low <= self.zstd_level <= high, f"zstd_level must be in {low}..{high}"),
        ]
        raise_problems(checks, "invalid collector settings")
        return self
