"""`tinkertrace collector`: the OTLP receiver writing spans to partitioned Parquet."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from tinkertrace.cli.extras import needs_extra

TOKEN_ENV = "TINKERTRACE_COLLECTOR_TOKEN"
# Arrow's allocator (mimalloc) hands memory unused for a second back to the OS. The Parquet writer frees
# a file's buffers every few seconds and fills them again, so the collector kept faulting the same
# memory back in, zeroed as huge pages: ~2% of its CPU. After a minute unused it still goes back.
# mimalloc reads this when pyarrow loads; a value already in the environment wins.
ALLOCATOR_ENV = {"MIMALLOC_PURGE_DELAY": "60000"}
ZSTD_LEVELS = (-131072, 22)  # what zstd accepts (pyarrow.Codec.minimum/maximum_compression_level)


def zstd_level_option(help: str) -> Any:
    """The ``--zstd-level`` option of the commands that write span files (``help`` says what for)."""
    return typer.Option(min=ZSTD_LEVELS[0], max=ZSTD_LEVELS[1], help=help)


def mib_bytes(mib: float) -> int:
    """A size option given in MiB, in bytes."""
    return int(mib * 1024 * 1024)


def collector(
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Folder the span Parquet files go to (hive date=/hour=).")
    ],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    http_port: Annotated[int, typer.Option(help="OTLP/HTTP port (POST /v1/traces).")] = 4318,
    grpc_port: Annotated[int, typer.Option(help="OTLP/gRPC port (TraceService/Export).")] = 4317,
    http: Annotated[bool, typer.Option("--http/--no-http", help="Serve OTLP/HTTP.")] = True,
    grpc: Annotated[bool, typer.Option("--grpc/--no-grpc", help="Serve OTLP/gRPC.")] = True,
    token: Annotated[
        str | None,
        typer.Option(help=f"Require 'Authorization: Bearer <token>' on every request (or set {TOKEN_ENV})."),
    ] = None,
    instance: Annotated[
        str | None,
        typer.Option(
            help="Name of this collector in WAL folder and file names; unique per shared --out folder. "
            "Default: <hostname>-<port>."
        ),
    ] = None,
    wal_dir: Annotated[
        Path | None, typer.Option(help="Write-ahead log folder. Default: <out>/_wal/<instance>.")
    ] = None,
    max_request_mb: Annotated[
        float, typer.Option(help="Largest accepted request (after gunzip), MiB; larger → 413.")
    ] = 64,
    max_queue_mb: Annotated[
        float,
        typer.Option(
            help="Memory budget, MiB: request bodies from their head on, their converted spans until they "
            "are in a Parquet file, and the working memory of writing a file (peak RSS: the process at rest "
            "+ this + ~70 MB). At the budget new requests get 429/RESOURCE_EXHAUSTED."
        ),
    ] = 384,
    max_file_mb: Annotated[
        float,
        typer.Option(
            help="Roll a Parquet file at this much buffered data, MiB (or an eighth of the budget if less)."
        ),
    ] = 128,
    roll_seconds: Annotated[
        float, typer.Option(help="Roll the WAL segment and write Parquet files at least this often, seconds.")
    ] = 30.0,
    max_connections: Annotated[
        int,
        typer.Option(
            min=8, help="Open HTTP connections before new ones get 503 (lowered to fit the open-files limit)."
        ),
    ] = 1024,
    zstd_level: Annotated[
        int,
        zstd_level_option(
            "zstd level of the Parquet files. 1 is fast; negative levels take less CPU for larger "
            "files (-1: ~30% larger token pages on multi-turn rollouts, see docs/collector.md). "
            "'tinkertrace spans compact --zstd-level' can recompress closed hours harder."
        ),
    ] = 1,
) -> None:
    """Receive OTLP traces (HTTP and gRPC) and write them durably to hive-partitioned Parquet."""
    for name, value in ALLOCATOR_ENV.items():
        os.environ.setdefault(name, value)
    from tinkertrace.collector.server import CollectorConfig, run_collector

    config = CollectorConfig(
        out=out,
        host=host,
        http_port=http_port if http else None,
        grpc_port=grpc_port if grpc else None,
        token=token or os.environ.get(TOKEN_ENV) or None,
        instance=instance,
        wal_dir=wal_dir,
        max_request_bytes=mib_bytes(max_request_mb),
        max_queue_bytes=mib_bytes(max_queue_mb),
        max_file_bytes=mib_bytes(max_file_mb),
        roll_seconds=roll_seconds,
        zstd_level=zstd_level,
        max_connections=max_connections,
    )
    raise typer.Exit(run_collector(config))


def register(app: typer.Typer) -> None:
    """Add `tinkertrace collector` to the main app."""
    app.command(name="collector")(needs_extra("collector", "collector")(collector))
