"""README's two commands, `make demo` and `make test`, timed from a fresh clone of the repository's HEAD.

Each command runs in its own fresh clone (``git clone`` of ``--source``, default this checkout: its
committed HEAD, not the working tree), so each time includes the set-up it does itself (``.venv/`` for
both; ``make test`` also builds the foreign packages' environments). Records the wall time, for
``make test`` the pytest summary (passed, failed, skipped and pytest's own time), for ``make demo``
its ``summary.json`` (steps, reward first → last, held-out score, rollouts sampled and trained). One
result per command: ``quickstart--demo`` and ``quickstart--test``. ``--from-log`` reads a finished
``make test``'s output instead, ``--summary`` a finished demo's ``summary.json``.

    .venv/bin/python benchmarks/quickstart.py [--only demo|test] [--source DIR] [--keep DIR]
    .venv/bin/python benchmarks/quickstart.py --from-log make-test.log --wall-s 1041
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import record

MEASURES_OF = {
    "demo": ("src/tinkertrace", "cli", "collector", "schemas", "Makefile", "pyproject.toml"),
    "test": (
        "src/tinkertrace",
        "cli",
        "collector",
        "schemas",
        "tests",
        "examples",
        "Makefile",
        "pyproject.toml",
    ),
}
MEASURES = tuple(dict.fromkeys(p for paths in MEASURES_OF.values() for p in paths))
PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)\b")
PYTEST_LINE = re.compile(r"^=+ (.*\d+ (?:passed|failed).*) in ([\d.]+)s\b.*=+$", re.MULTILINE)


def pytest_summary(log: str) -> dict[str, float]:
    """The counts and seconds of pytest's last summary line (``== 839 passed, 3 skipped in 789.1s ==``)."""
    lines = PYTEST_LINE.findall(log)
    if not lines:
        raise ValueError("no pytest summary line in the log")
    counts, seconds = lines[-1]
    summary: dict[str, float] = {kind.rstrip("s") if kind.startswith("error") else kind: int(n)
                                 for n, kind in PYTEST_COUNT.findall(counts)}  # fmt: skip
    summary["pytest_s"] = float(seconds)
    return summary


def add_test_figures(result: record.Result, log: str, wall_s: float | None) -> None:
    """``make test``'s figures: its wall time, pytest's counts and pytest's own time."""
    if wall_s is not None:
        result.add("make_test_s", wall_s, "s", "`make test` from a fresh clone, set-up included")
    try:
        summary = pytest_summary(log)
    except ValueError:
        result.add("pytest_summary", "none", "", "pytest printed no summary (make stopped before it?)")
        return
    result.add("pytest_s", summary.pop("pytest_s"), "s", "of which pytest (its own summary)")
    for kind in ("passed", "failed", "skipped", "error"):
        result.add(f"tests_{kind}", int(summary.get(kind, 0)), "tests", f"pytest: {kind}")


def add_demo_figures(result: record.Result, summary: dict[str, Any]) -> None:
    """A demo's figures from its ``summary.json`` (shared with demo_smollm2.py)."""
    result.add("steps", summary["steps"], "steps", "training steps")
    result.add("demo_elapsed_s", summary["elapsed_s"], "s", "the demo's own training time (summary.json)")
    result.add("reward_first", summary["reward_first"], "", "mean reward of the first step")
    result.add("reward_last", summary["reward_last"], "", "mean reward of the last step")
    result.add("rollouts_sampled", summary["rollouts_sampled"], "rollouts", "rollouts sampled")
    result.add("rollouts_trained", summary["rollouts_trained"], "rollouts", "rollouts trained")
    heldout = summary.get("heldout")
    if heldout:
        for key in ("accuracy", "mean_reward"):
            what = f"held-out {key.replace('_', ' ')}" + (
                f" ({heldout['correct']})" if key == "accuracy" else ""
            )
            result.add(f"heldout_{key}_before", heldout["before"][key], "", f"{what}, before training")
            result.add(f"heldout_{key}_after", heldout["after"][key], "", f"{what}, after training")


def run_logged(command: list[str], cwd: Path, log: Path) -> tuple[float, int]:
    """Run ``command`` in ``cwd``, its output echoed and written to ``log``; its wall seconds and exit
    status."""
    started = time.perf_counter()
    with (
        log.open("w") as out,
        subprocess.Popen(
            command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        ) as proc,
    ):
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            sys.stdout.write(line)
    seconds = time.perf_counter() - started
    return seconds, proc.returncode


def fresh_clone(source: Path, into: Path) -> str:
    """Clone ``source``'s HEAD into ``into``; the commit cloned."""
    subprocess.run(["git", "clone", "--quiet", str(source), str(into)], check=True)
    return record.git("rev-parse", "HEAD", root=into)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", choices=sorted(MEASURES_OF), help="run one of the two commands")
    parser.add_argument("--source", type=Path, default=record.ROOT, help="the repository to clone")
    parser.add_argument(
        "--keep", type=Path, help="clone into DIR/<command> and keep it (default: a temp dir)"
    )
    parser.add_argument(
        "--log-dir", type=Path, default=Path(tempfile.gettempdir()), help="where make's output is kept"
    )
    parser.add_argument("--from-log", type=Path, help="record a finished `make test` from its output")
    parser.add_argument("--wall-s", type=float, help="with --from-log: its wall time in seconds")
    parser.add_argument("--summary", type=Path, help="record a finished `make demo` from its summary.json")
    record.add_arguments(parser)
    args = parser.parse_args()
    if args.from_log or args.summary:
        for step, given in (("test", args.from_log), ("demo", args.summary)):
            if given:
                result = record.start(__file__, MEASURES_OF[step], args, variant=step)
                if step == "test":
                    add_test_figures(result, given.read_text(), args.wall_s)
                else:
                    add_demo_figures(result, json.loads(given.read_text()))
                result.save()
        return
    for step in [args.only] if args.only else ["demo", "test"]:
        result = record.start(__file__, MEASURES_OF[step], args, variant=step)
        with tempfile.TemporaryDirectory(prefix=f"tt-quickstart-{step}-") as tmp:
            clone = (args.keep or Path(tmp)) / step
            result.clone_commit = fresh_clone(args.source.resolve(), clone)
            log = args.log_dir / f"tinkertrace-quickstart-make-{step}.log"
            wall, status = run_logged(["make", step], clone, log)
            print(
                f"make {step} from a fresh clone of {result.clone_commit[:7]}: exit {status}, {wall:,.0f} s"
            )
            print(f"its output: {log}")
            result.add(f"make_{step}_exit", status, "", f"`make {step}`'s exit status")
            if step == "test":
                add_test_figures(result, log.read_text(), wall)
            else:
                result.add(
                    "make_demo_s", wall, "s", "`make demo` from a fresh clone, set-up (.venv) included"
                )
                summaries = sorted(clone.glob("tinkertrace-demo-*/summary.json"))
                if not summaries:
                    raise SystemExit(f"make demo left no summary.json (output in {log})")
                add_demo_figures(result, json.loads(summaries[-1].read_text()))
            result.save()


if __name__ == "__main__":
    main()
