"""DuckDB over span Parquet → token-level triplets → trajectories.

``from tinkertrace.builder import BuildOptions, build_trajectories``; see docs/builder.md.
"""

from tinkertrace.builder.build import BuildResult, build_trajectories
from tinkertrace.builder.options import BuildOptions
from tinkertrace.builder.summary import BuildSummary

__all__ = ["BuildOptions", "BuildResult", "BuildSummary", "build_trajectories"]
