"""What an agent that only traces pays to install and start tinkertrace.

For each source tree given (default: this checkout), builds a fresh virtualenv with
``pip install TREE`` (no extras: what ``pip install tinkertrace`` gives), then prints the installed
distributions, the bytes of site-packages (pip, setuptools and wheel excluded: every venv has them)
and the wall time of ``import tinkertrace`` + ``tinkertrace.init(endpoint=...)`` in a new process,
timed in rounds that alternate between the trees so both see the same machine load.

    python benchmarks/sdk_footprint.py [TREE ...] [--rounds 7]

To compare with an older commit: ``git worktree add /tmp/before <commit>`` and pass both trees.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import record

MEASURES = ("src/tinkertrace/sdk", "src/tinkertrace/__init__.py", "pyproject.toml")

BASELINE = {"pip", "setuptools", "wheel", "_distutils_hack", "distutils-precedence.pth"}
INIT = (
    "import time; t = time.perf_counter(); import tinkertrace; "
    "tinkertrace.init(endpoint='http://127.0.0.1:9', service_name='footprint'); "
    "print(time.perf_counter() - t)"
)


def build_venv(tree: Path, root: Path) -> Path:
    """A new venv under ``root`` with ``tree`` installed (no extras); its python."""
    venv = root / tree.name
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", str(tree)], check=True)
    return python


def site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return Path(out.stdout.strip())


def footprint(python: Path) -> tuple[int, int]:
    """(distributions, bytes) installed beside pip/setuptools."""
    site = site_packages(python)
    total, dists = 0, 0
    for entry in site.iterdir():
        stem = entry.name.split("-")[0].lower()
        if stem in BASELINE or entry.name in BASELINE:
            continue
        if entry.name.endswith(".dist-info"):
            dists += 1
        files = [entry] if entry.is_file() else [p for p in entry.rglob("*") if p.is_file()]
        total += sum(p.stat().st_size for p in files)
    return dists, total


def init_seconds(python: Path) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TINKERTRACE_")}
    out = subprocess.run([str(python), "-c", INIT], check=True, capture_output=True, text=True, env=env)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("trees", nargs="*", type=Path, default=[Path(__file__).resolve().parents[1]])
    parser.add_argument("--rounds", type=int, default=7)
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(__file__, MEASURES, args)
    with tempfile.TemporaryDirectory() as tmp:
        pythons = {}
        for i, tree in enumerate(args.trees):
            root = Path(tmp) / str(i)
            root.mkdir()
            pythons[tree] = build_venv(tree.resolve(), root)
        times: dict[Path, list[float]] = {tree: [] for tree in args.trees}
        for _ in range(args.rounds):  # interleaved: every round times each tree once
            for tree, python in pythons.items():
                times[tree].append(init_seconds(python))
        load = os.getloadavg()[0]
        print(f"{'tree':<40} {'dists':>6} {'MB':>8} {'init median s':>14} {'min s':>7}   (load {load:.1f})")
        for tree, python in pythons.items():
            dists, size = footprint(python)
            ts = times[tree]
            median = statistics.median(ts)
            print(f"{tree!s:<40} {dists:>6} {size / 1e6:>8.1f} {median:>14.3f} {min(ts):>7.3f}")
            if tree.resolve() == record.ROOT:  # this checkout's figures (other trees are for comparison)
                result.add(
                    "distributions", dists, "", "installed distributions (pip, setuptools, wheel excluded)"
                )
                result.add("site_packages_mb", size / 1e6, "MB", "site-packages of `pip install tinkertrace`")
                result.add(
                    "init_s", median, "s", f"import + init() in a new process, median of {args.rounds}"
                )
    if result.figures:
        result.save()


if __name__ == "__main__":
    main()
