"""DuckDB over span Parquet → token-level triplets → trajectories.

``from tinkertrace.builder import BuildOptions, build_trajectories``; see docs/builder.md. The names load
on first use, so importing ``tinkertrace.builder.options`` (settings, help) loads no DuckDB.
"""

from tinkertrace.lazy import lazy_attributes

__all__ = ["BuildOptions", "BuildResult", "BuildSummary", "build_trajectories"]
__getattr__ = lazy_attributes(
    __name__,
    {
        "BuildOptions": "tinkertrace.builder.options",
        "BuildResult": "tinkertrace.builder.build",
        "BuildSummary": "tinkertrace.builder.summary",
        "build_trajectories": "tinkertrace.builder.build",
    },
)
