"""DuckDB over span Parquet → token-level triplets → trajectories.

``from tinkertrace.builder import BuildOptions, build_trajectories``; see docs/builder.md. The names are
loaded on first use, so importing ``tinkertrace.builder.options`` (settings, help) loads no DuckDB.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {
    "BuildOptions": "tinkertrace.builder.options",
    "BuildResult": "tinkertrace.builder.build",
    "BuildSummary": "tinkertrace.builder.summary",
    "build_trajectories": "tinkertrace.builder.build",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
