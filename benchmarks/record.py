"""The one way a benchmark writes its result as JSON, beside the table it prints (issue 51).

A script declares what it measures (``MEASURES``: the paths whose change makes its figures stale), adds
:func:`add_arguments` to its parser, calls :func:`start` before it measures, :meth:`Result.add` for each
figure it prints and :meth:`Result.save` at the end. The file, ``benchmarks/results/<stem>.json`` (or
``<stem>--<variant>.json``), holds the figures, the exact command, the date, the commit and the measured
files that differed from it, the machine and the load average at start and end;
``benchmarks/results_page.py`` turns the files into ``docs/results.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"
# What a run of the whole online stack (the demo's) measures: trainer, endpoint, engine, builder, collector.
ONLINE_STACK = (
    "src/tinkertrace/online",
    "src/tinkertrace/training",
    "src/tinkertrace/serving",
    "src/tinkertrace/engine",
    "src/tinkertrace/builder",
    "collector",
)
# The packages whose versions a result names (those installed).
PACKAGES = ("tinkertrace", "torch", "transformers", "pyarrow", "duckdb", "numba", "numpy", "uvicorn", "httpx")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--results-dir`` (default benchmarks/results) and ``--no-results``."""
    group = parser.add_argument_group("recorded result (docs/results.md)")
    group.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where the result's JSON goes")
    group.add_argument("--no-results", action="store_true", help="print only, write no JSON")


def slug(text: str) -> str:
    """``text`` as part of a figure's name: lower case, runs of other characters as ``_``."""
    return "_".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


def git(*args: str, root: Path = ROOT) -> str:
    """A git command's stdout in ``root``, trailing whitespace stripped."""
    done = subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True)
    return done.stdout.rstrip()


def measured_paths(script: Path, measures: Sequence[str], root: Path = ROOT) -> list[str]:
    """The script and its measured paths, relative to ``root``, symlinks resolved (git diffs a symlink's
    target, not the link: ``src/tinkertrace/collector`` is ``collector``)."""
    paths = []
    for name in (str(script.resolve().relative_to(root)), *measures):
        path = (root / name).resolve()
        if not path.exists():
            raise ValueError(f"measured path {name!r} does not exist under {root}")
        paths.append(path.relative_to(root.resolve()).as_posix())
    return paths


def machine() -> dict[str, Any]:
    """Cores, CPU model, memory, OS, Python and the versions of :data:`PACKAGES` that are installed."""
    cpu = platform.processor() or platform.machine()
    memory_gib = None
    for line in _lines("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    for line in _lines("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            memory_gib = round(int(line.split()[1]) / 2**20, 1)
    packages = {}
    for name in PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            packages[name] = metadata.version(name)
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": memory_gib,
        "os": platform.platform(),
        "python": platform.python_version(),
        "packages": packages,
    }


def _lines(path: str) -> list[str]:
    try:
        return Path(path).read_text().splitlines()
    except OSError:
        return []


def _rounded(load: Sequence[float]) -> list[float]:
    return [round(x, 2) for x in load]


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def command_line(script: Path, argv: Sequence[str], root: Path = ROOT) -> str:
    """The command as typed from the repository root (``.venv/bin/python benchmarks/x.py ...``)."""
    python = Path(sys.executable)
    shown = python.relative_to(root).as_posix() if python.is_relative_to(root) else "python"
    return shlex.join([shown, script.resolve().relative_to(root).as_posix(), *argv])


class Result:
    """One run's figures; :meth:`save` writes them with where, when and on what they were measured."""

    def __init__(
        self,
        script: Path,
        measures: Sequence[str],
        results_dir: Path | None,
        variant: str = "",
        argv: Sequence[str] | None = None,
        root: Path = ROOT,
    ) -> None:
        self.root = root
        self.stem = script.stem
        self.variant = variant
        self.results_dir = results_dir
        self.measures = measured_paths(script, measures, root)
        self.command = command_line(script, sys.argv[1:] if argv is None else argv, root)
        self.started = _now()
        self.load_start = os.getloadavg()
        self.t0 = time.perf_counter()
        self.figures: dict[str, dict[str, Any]] = {}
        self.clone_commit: str | None = None  # set when measured on a fresh clone of this commit

    def add(self, name: str, value: float | int | str, unit: str, description: str) -> None:
        """Record one figure (``name`` is its key in the page's markers: letters, digits, ``_``)."""
        if name != slug(name):
            raise ValueError(f"figure name {name!r}: lower-case letters, digits and _ only (record.slug)")
        if isinstance(value, float):  # four significant digits, whole numbers from 1,000
            value = round(value) if abs(value) >= 1000 else float(f"{value:.4g}")
        self.figures[name] = {"value": value, "unit": unit, "description": description}

    @property
    def path(self) -> Path | None:
        if self.results_dir is None:
            return None
        name = f"{self.stem}--{self.variant}" if self.variant else self.stem
        return self.results_dir / f"{name}.json"

    def data(self) -> dict[str, Any]:
        """The result as it is written: figures, command, date, commit, dirty files, machine, load."""
        status = (
            "" if self.clone_commit else git("status", "--porcelain", "--", *self.measures, root=self.root)
        )
        return {
            "script": self.stem,
            "variant": self.variant,
            "command": self.command,
            "started": self.started,
            "finished": _now(),
            "wall_s": round(time.perf_counter() - self.t0, 1),
            "commit": self.clone_commit or git("rev-parse", "HEAD", root=self.root),
            "dirty": [line[3:] for line in status.splitlines()],
            "measures": self.measures,
            "machine": machine(),
            "load": {"start": _rounded(self.load_start), "end": _rounded(os.getloadavg())},
            "figures": self.figures,
        }

    def save(self) -> Path | None:
        """Write the JSON (unless ``--no-results``) and say where; returns its path."""
        path = self.path
        if path is None:
            return None
        if not self.figures:
            raise ValueError(f"{self.stem}: no figures to record")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.data(), indent=1, ensure_ascii=False) + "\n")
        print(f"result recorded in {path} (docs/results.md: python benchmarks/results_page.py)")
        return path


def start(script: str, measures: Sequence[str], args: argparse.Namespace, variant: str = "") -> Result:
    """A result for ``script`` (``__file__``), written to ``args.results_dir`` unless ``--no-results``."""
    results_dir = None if getattr(args, "no_results", False) else getattr(args, "results_dir", RESULTS_DIR)
    return Result(Path(script), measures, results_dir, variant)
