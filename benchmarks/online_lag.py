"""Online loop figures: what is sampled vs trained, the rollout-end → trained lag and where it goes.

Runs the demo's whole stack (collector subprocess, local-engine endpoint, agent worker processes,
follow trainer publishing into the endpoint) once per arm and prints, for each run:

- rollouts sampled, trained, dropped (stale / constant reward) and in flight at the end;
- lag from a rollout's end to the end of the step that trained it, p50/p95, and its parts (p95):
  ``arrive`` (span export + collector roll + tail build), ``queue`` (waiting for the rest of its
  group and batch and for the step before), ``train`` (its own step);
- training step time, wall seconds per step, and the reward first → last steps;
- the endpoint's admission counts (admitted / held, wait p95).

Arms (``--arms``, interleaved ``--pairs`` times so the machine's drift hits both alike):

- ``before``: no admission, max staleness 3, collector roll 0.5 s, span export delay 0.1 s (the
  demo's settings before admission);
- ``after``: the demo's defaults (admission on, max staleness 1, roll 0.2 s, export 0.05 s).

Usage: ``python benchmarks/online_lag.py --pairs 2 --steps 30``
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import tempfile
from pathlib import Path
from typing import Any

import record
from rich.console import Console

from tinkertrace.online.demo import run_demo
from tinkertrace.online.settings import DemoSettings

MEASURES = record.ONLINE_STACK

ARMS: dict[str, dict[str, Any]] = {
    "before": {"admission": False, "max_staleness": 3, "roll_seconds": 0.5, "export_delay_s": 0.1},
    "after": {},
}


def _row(name: str, s: dict[str, Any]) -> str:
    dropped, parts, gate = s["rollouts_dropped"], s["lag_parts_p95_s"], s.get("admission") or {}
    admission = "off"
    if gate.get("capacity"):
        admission = f"{gate['admitted']}/{gate['held']} wait p95 {gate['wait_p95_s']:.2f}s"
    trained = f"{s['rollouts_trained']:5d} ({100 * (s['trained_fraction'] or 0):.0f}%)"
    return (
        f"{name:6} steps {s['steps']:3d}  wall/step {s['elapsed_s'] / max(1, s['steps']):.2f}s  "
        f"step {s['step_time_mean_s']:.2f}s  sampled {s['rollouts_sampled']:5d}  trained {trained}  "
        f"stale {dropped['stale']:4d}  const {dropped['constant_reward']:3d}  "
        f"in flight {s['rollouts_in_flight_at_end']:3d}  "
        f"lag p50 {s['lag_p50_s']:.2f}s p95 {s['lag_p95_s']:.2f}s (arrive {parts['arrive']:.2f} queue "
        f"{parts['queue']:.2f} train {parts['train']:.2f})  reward {s['reward_first']:.3f}->"
        f"{s['reward_last']:.3f}  admitted/held {admission}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=1, help="interleaved rounds of every arm")
    parser.add_argument("--steps", type=int, default=30, help="training steps per run")
    parser.add_argument("--max-seconds", type=float, default=240, help="cap of each run's training")
    parser.add_argument("--workers", type=int, default=2, help="agent worker processes")
    parser.add_argument("--arms", default="before,after", help=f"comma-separated, of {', '.join(ARMS)}")
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(__file__, MEASURES, args)
    arms = args.arms.split(",")
    unknown = set(arms) - set(ARMS)
    if unknown:
        parser.error(f"unknown arm(s): {', '.join(sorted(unknown))}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores (shared with other work if any)")
    print(f"each run: {args.steps} steps (cap {args.max_seconds:.0f}s), {args.workers} workers, demo model")
    quiet = Console(file=io.StringIO())
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in arms}
    for pair in range(args.pairs):
        for name in arms:
            with tempfile.TemporaryDirectory(prefix="tt-online-bench-") as tmp:
                settings = DemoSettings(
                    out=Path(tmp),
                    steps=args.steps,
                    workers=args.workers,
                    max_seconds=args.max_seconds,
                    **ARMS[name],
                )
                summary = run_demo(settings, console=quiet)
            print(f"[{pair + 1}] " + _row(name, summary), flush=True)
            runs[name].append(summary)
    for name, summaries in runs.items():
        what = f"{name}: median of {args.pairs} run(s) of {args.steps} steps"

        def median(key: str, s: list[dict[str, Any]] = summaries) -> float:
            return statistics.median(float(x[key] or 0) for x in s)

        result.add(f"{name}_lag_p50_s", median("lag_p50_s"), "s", f"{what}: rollout end → trained, p50")
        result.add(f"{name}_lag_p95_s", median("lag_p95_s"), "s", f"{what}: rollout end → trained, p95")
        result.add(
            f"{name}_trained_frac", median("trained_fraction"), "", f"{what}: sampled rollouts trained"
        )
        result.add(f"{name}_step_s", median("step_time_mean_s"), "s", f"{what}: mean training step")
        result.add(f"{name}_reward_last", median("reward_last"), "", f"{what}: mean reward, last step")
    result.save()


if __name__ == "__main__":
    main()
