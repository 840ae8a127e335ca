"""DuckDB over span Parquet → token-level triplets → trajectories.

``from tinkertrace.builder import BuildSettings, build_trajectories``; see docs/builder.md. The names load
on first use, so importing ``tinkertrace.builder.options`` (settings, help) loads no DuckDB.
"""

from typing import TYPE_CHECKING

from tinkertrace.lazy import lazy_attributes

if TYPE_CHECKING:  # what type checkers see; at run time each name loads on first use
    from tinkertrace.builder.build import BuildResult, build_trajectories
    from tinkertrace.builder.options import BuildSettings
    from tinkertrace.builder.summary import BuildSummary

__all__ = ["BuildResult", "BuildSettings", "BuildSummary", "build_trajectories"]
__getattr__ = lazy_attributes(
    __name__,
    {
        "BuildSettings": "tinkertrace.builder.options",
        "BuildResult": "tinkertrace.builder.build",
        "BuildSummary": "tinkertrace.builder.summary",
        "build_trajectories": "tinkertrace.builder.build",
    },
)
