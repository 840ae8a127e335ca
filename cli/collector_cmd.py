"""`tinkertrace collector`: the OTLP receiver writing spans to partitioned Parquet."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from tinkertrace.cli.extras import needs_extra
from tinkertrace.cli.options import OptionsOf, config_option, validated, with_settings
from tinkertrace.collector.settings import CollectorSettings

# Arrow's allocator (mimalloc) hands memory unused for a second back to the OS. The Parquet writer frees
# a file's buffers every few seconds and fills them again, so the collector kept faulting the same
# memory back in, zeroed as huge pages: ~2% of its CPU. After a minute unused it still goes back.
# mimalloc reads this when pyarrow loads; a value already in the environment wins.
ALLOCATOR_ENV = {"MIMALLOC_PURGE_DELAY": "60000"}


@with_settings
def collector(
    settings: dict[str, Any] = OptionsOf(CollectorSettings),
    config: Annotated[Path | None, config_option(CollectorSettings, section="collector")] = None,
) -> None:
    """Receive OTLP traces and logs (HTTP and gRPC) and write them durably to hive-partitioned Parquet."""
    checked = validated(CollectorSettings, settings, config, section="collector")
    for name, value in ALLOCATOR_ENV.items():
        os.environ.setdefault(name, value)
    from tinkertrace.collector.server import run_collector

    raise typer.Exit(run_collector(checked))


def register(app: typer.Typer) -> None:
    """Add `tinkertrace collector` to the main app."""
    app.command(name="collector")(needs_extra("collector", "collector")(collector))
