"""What a run folder holds, found on disk: span folders, built tables, training log folders.

``tinkertrace ui`` takes run folders (a demo's output, a training log folder, a build output) or span
folders. :func:`discover` looks again on every refresh, so files a live run creates later (its
``metrics.jsonl``, a new build) are picked up without a restart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from tinkertrace.spanstore.reader import check_file, list_span_files
from tinkertrace.training.metrics import METRICS_FILE

TRAJECTORIES_FILE = "trajectories.parquet"
TRIPLETS_FILE = "triplets.parquet"
CONFIG_FILE = "config.json"  # a training log folder's settings (training.step)
SUMMARY_FILE = "summary.json"  # an online run's summary (online.report)
SPANS_SUBDIR = "spans"  # where a demo or online stack keeps its spans
BUILT_NAMES = (TRAJECTORIES_FILE, TRIPLETS_FILE)
SEARCH_DEPTH = 4  # folder levels below a run folder searched for logs and built tables


@dataclass
class RunSources:
    """The files of one run the app reads (all read-only)."""

    roots: list[Path]
    spans_dirs: list[Path] = field(default_factory=list)
    trajectory_files: list[Path] = field(default_factory=list)
    triplet_files: list[Path] = field(default_factory=list)
    log_dirs: list[Path] = field(default_factory=list)  # folders with metrics.jsonl and/or config.json
    summary_files: list[Path] = field(default_factory=list)

    def config_files(self) -> list[Path]:
        """The training settings files (``config.json``) of the log folders."""
        return [d / CONFIG_FILE for d in self.log_dirs]

    def describe(self) -> list[tuple[str, str]]:
        """(what, paths) rows for the run page."""
        rows = [
            ("span folders", self.spans_dirs),
            ("trajectory files", self.trajectory_files),
            ("triplet files", self.triplet_files),
            ("training log folders", self.log_dirs),
            ("run summaries", self.summary_files),
        ]
        return [(what, ", ".join(str(p) for p in paths) or "-") for what, paths in rows]


def _columns(path: Path) -> set[str]:
    try:
        return set(pq.read_schema(path).names)
    except Exception:  # unreadable: the span reader reports it, a built table is just not used
        return set()


def is_spans_dir(path: Path) -> bool:
    """A folder of span Parquet files: hive ``date=`` partitions, or top-level files with span ids."""
    if not path.is_dir():
        return False
    if any(p.is_dir() and p.name.startswith("date=") for p in path.iterdir()):
        return True
    return any(
        {"trace_id", "span_id"} <= _columns(p)
        for p in sorted(path.glob("*.parquet"))
        if p.name not in BUILT_NAMES
    )


def _walk(root: Path, depth: int, skip: set[Path]) -> list[Path]:
    """Folders under ``root`` (itself included) down to ``depth`` levels, minus ``skip`` and hidden ones."""
    found, level = [root], [root]
    for _ in range(depth):
        level = [
            child
            for folder in level
            for child in sorted(folder.iterdir())
            if child.is_dir() and not child.name.startswith((".", "_")) and child not in skip
        ]
        found += level
    return found


def _config_source(log_dir: Path) -> Path | None:
    """The spans folder a training run read (``source`` in its config.json), when it still exists."""
    try:
        source = json.loads((log_dir / CONFIG_FILE).read_text()).get("source")
    except (OSError, ValueError, AttributeError):
        return None
    candidates = [Path(source)] if source else []
    candidates += [log_dir.parent / Path(source).name] if source else []
    return next((c.resolve() for c in candidates if is_spans_dir(c)), None)


def discover(paths: list[Path]) -> RunSources:
    """Everything the app can read under ``paths`` (each a run folder, spans folder or built file)."""
    sources = RunSources(roots=[Path(p).resolve() for p in paths])
    spans: list[Path] = []
    for root in sources.roots:
        if root.is_file():
            _add_file(sources, root)
            continue
        if is_spans_dir(root):
            spans.append(root)
            continue
        if is_spans_dir(root / SPANS_SUBDIR):
            spans.append(root / SPANS_SUBDIR)
        if (root / SUMMARY_FILE).is_file():
            sources.summary_files.append(root / SUMMARY_FILE)
        for folder in _walk(root, SEARCH_DEPTH, set(spans)):
            if is_spans_dir(folder) and folder not in spans and folder != root:
                spans.append(folder)
                continue
            for name in BUILT_NAMES:
                if (folder / name).is_file():
                    _add_file(sources, folder / name)
            if (folder / METRICS_FILE).is_file() or (folder / CONFIG_FILE).is_file():
                sources.log_dirs.append(folder)
    if not spans:  # a training log folder alone: the spans it was trained from, when they still exist
        spans += [s for d in sources.log_dirs if (s := _config_source(d)) is not None]
    sources.spans_dirs = list(dict.fromkeys(spans))
    return sources


def _add_file(sources: RunSources, path: Path) -> None:
    columns = _columns(path)
    if "action_mask" in columns:
        sources.trajectory_files.append(path)
    elif "turn" in columns and "response_token_ids" in columns:
        sources.triplet_files.append(path)
    elif path.name == METRICS_FILE:
        sources.log_dirs.append(path.parent)


def span_files(sources: RunSources) -> list[Path]:
    """Every committed span file of the run (the reader's listing: temporary and hidden files left out)."""
    return [f for d in sources.spans_dirs for f in list_span_files(d)]


def not_span_files(sources: RunSources, limit: int = 20) -> list[tuple[Path, str]]:
    """Parquet files under the run's folders that are not span files, and why (for a run showing no
    spans: what was found instead). Built tables are left out; at most ``limit``."""
    found: list[tuple[Path, str]] = []
    for root in sources.roots:
        files = [root] if root.is_file() else sorted(root.rglob("*.parquet")) if root.is_dir() else []
        for path in files:
            if path.name in BUILT_NAMES or len(found) >= limit:
                continue
            if (problem := check_file(path)) is not None:
                found.append((path, problem))
    return found


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file, or {} when it is missing or not an object (a run still writing it)."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
