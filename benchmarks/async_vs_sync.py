"""Asynchronous vs synchronous RL on the long-tail multi-turn task (``examples/long_tail``), or on the
demo's own identity task (``--agent tinkertrace.online.demo_agent``: the built-in demo, old follow vs new).

Runs the demo's whole stack (collector subprocess, local-engine endpoint with admission, agent worker
processes running :mod:`examples.long_tail.agent`, follow trainer publishing each step) once per mode,
the modes interleaved ``--pairs`` times on the same seed, model and machine, each for the same
``--seconds`` of training. Modes (``--modes``, any of :data:`MODES`):

- ``sync``: ``--sync`` (staleness 0 with admission: a step trains only rollouts of the policy it
  updates), requests finishing on the weights they started on (``--inflight off``); a step waits for
  its groups' longest episodes (group timeout 300 s, not the demo's 10 s, which trained groups
  without them and lost them as stale);
- ``drop``: follow with ``--max-staleness S``, rollouts over the bound dropped, ``--inflight off``
  (follow mode as it was before in-flight updates);
- ``drop-inflight``: the same with in-flight updates (keep-cache): the demo's defaults;
- ``correct``: follow with ``--max-staleness S --staleness-mode correct`` (whole groups over the bound
  dropped, the rest trained with the decoupled-PPO correction) and in-flight updates (keep-cache);
- ``correct-no-inflight``: the same correction with ``--inflight off``.

A mode followed by ``/N`` (``correct/4``) trains each step in ``N`` optimiser steps on ``N`` minibatches
(``--num-substeps N``), so PPO's clip bounds the step's later updates.

For each run it prints, from the agents' own logs (every sampled rollout, trained or not, so dropping
long episodes cannot flatter a mode): wall seconds and sampled rollouts until the mean reward of the
last ``--window`` sampled rollouts first reaches ``--threshold``; the mean reward of the rollouts that
ended in the last quarter of the common horizon (final reward at equal wall time) and its rise over
the first window's, per 100 s of the horizon; and, from the
trainer: steps, share of sampled rollouts trained, lag p50/p95, and the ``offpolicy/…`` figures
(mismatch KL: mean and max over steps, and by token age — age 0 the sampler/trainer mismatch of the
same weights, age 1 the drift of one update; truncated and clipped shares, token ages, seconds waited
for stragglers).

Usage: ``python benchmarks/async_vs_sync.py --pairs 1 --seconds 150``
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import record
from rich.console import Console

from tinkertrace.models.builtin import DEMO_MODEL
from tinkertrace.online.demo import demo_configs, run_demo
from tinkertrace.online.settings import DemoSettings
from tinkertrace.training.jsonl import read_jsonl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the examples package, when run as a script

from examples.long_tail.agent import TOOL_ENV  # noqa: E402

MEASURES = (*record.ONLINE_STACK, "examples/long_tail")

AGENT = "examples.long_tail.agent"
# Sync waits for its batch's stragglers (the cost it is measured for): the demo's 10 s group timeout
# would train a group without its long episodes, which are then stale — lost, not waited for.
SYNC_GROUP_TIMEOUT_S = 300.0
MODES: dict[str, dict[str, Any]] = {
    "sync": {"sync": True, "inflight": "off", "group_timeout_s": SYNC_GROUP_TIMEOUT_S},
    "drop": {"staleness_mode": "drop", "inflight": "off"},
    "drop-inflight": {"staleness_mode": "drop", "inflight": "keep-cache"},
    "correct": {"staleness_mode": "correct", "inflight": "keep-cache"},
    "correct-no-inflight": {"staleness_mode": "correct", "inflight": "off"},
}


def reward_curve(rows: list[dict[str, Any]], window: int) -> tuple[np.ndarray, np.ndarray]:
    """Seconds since the first rollout started, at each sampled rollout's end (in order), and the
    mean reward of the last ``window`` rollouts ended by then."""
    ok = sorted((r for r in rows if "reward" in r), key=lambda r: r["end"])
    if not ok:
        return np.zeros(0), np.zeros(0)
    start = min(r["start"] for r in ok)
    ends = np.array([r["end"] - start for r in ok])
    rewards = np.array([r["reward"] for r in ok], dtype=np.float64)
    sums = np.concatenate([[0.0], np.cumsum(rewards)])
    idx = np.arange(1, len(rewards) + 1)
    lo = np.maximum(0, idx - window)
    return ends, (sums[idx] - sums[lo]) / (idx - lo)


def settled(summary: dict[str, Any]) -> int:
    """Sampled rollouts the trainer trained or dropped (not those in flight when the run ended)."""
    return int(summary["rollouts_sampled"]) - int(summary["rollouts_in_flight_at_end"])


def figures(
    rows: list[dict[str, Any]], summary: dict[str, Any], threshold: float, window: int, horizon: float
) -> dict[str, Any]:
    """One run's row of the table."""
    ends, curve = reward_curve(rows, window)
    reached = np.flatnonzero((curve >= threshold) & (np.arange(len(curve)) >= window - 1))
    ok = sorted((r for r in rows if "reward" in r), key=lambda r: r["end"])
    start = min(r["start"] for r in ok) if ok else 0.0
    late = [r["reward"] for r in ok if 0.75 * horizon <= r["end"] - start <= horizon]
    off = summary["offpolicy"]
    first = float(curve[min(window, len(curve)) - 1]) if len(curve) else None
    final = float(np.mean(late)) if late else None
    return {
        "steps": summary["steps"],
        "sampled": summary["rollouts_sampled"],
        "trained_frac": summary["trained_fraction"],
        # of the rollouts the trainer is done with (trained or dropped): the run's end leaves the rest
        "trained_of_settled": summary["rollouts_trained"] / max(1, settled(summary)),
        "dropped_stale": summary["rollouts_dropped"]["stale"],
        "in_flight": summary["rollouts_in_flight_at_end"],
        "to_threshold_s": float(ends[reached[0]]) if reached.size else None,
        "to_threshold_rollouts": int(reached[0] + 1) if reached.size else None,
        "final_reward": final,
        "reward_first_window": first,
        "rise_per_100s": None if first is None or final is None else 100 * (final - first) / horizon,
        "step_s": summary["step_time_mean_s"],
        "lag_p50_s": summary["lag_p50_s"],
        "lag_p95_s": summary["lag_p95_s"],
        "mismatch_kl_mean": off["mismatch_kl_mean"],
        "mismatch_kl_max": off["mismatch_kl_max"],
        "mismatch_kl_by_age": off["mismatch_kl_by_age"],
        "truncated_frac": off["truncated_frac_mean"],
        "clipped_frac": off["clipped_frac_mean"],
        "token_age": off["token_age"],
        "straggler_wait_s": off["straggler_wait_s"],
        "turns_mean": float(np.mean([r.get("turns", 1) for r in ok])) if ok else None,
    }


def _f(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def row_text(name: str, f: dict[str, Any]) -> str:
    ages = "/".join(str(n) for n in f["token_age"].values())
    return (
        f"{name:8} steps {f['steps']:3d}  sampled {f['sampled']:4d}  "
        f"trained {_f(f['trained_frac'], '.1%'):>6} "
        f"(stale {f['dropped_stale']}, in flight {f['in_flight']}; "
        f"{_f(f['trained_of_settled'], '.1%')} of the settled)  "
        f"to threshold {_f(f['to_threshold_s'], '.0f'):>4}s / "
        f"{_f(f['to_threshold_rollouts'], 'd'):>4} rollouts  "
        f"reward {_f(f['reward_first_window'], '.3f')} -> final {_f(f['final_reward'], '.3f')} "
        f"({_f(f['rise_per_100s'], '+.3f')} per 100 s)  "
        f"step {_f(f['step_s'], '.2f')}s  "
        f"lag p50/p95 {_f(f['lag_p50_s'], '.1f')}/{_f(f['lag_p95_s'], '.1f')}s  "
        f"mismatch KL {_f(f['mismatch_kl_mean'], '.2g')} (max {_f(f['mismatch_kl_max'], '.2g')}; "
        f"by age 0/1 {_f(f['mismatch_kl_by_age']['0'], '.2g')}/{_f(f['mismatch_kl_by_age']['1'], '.2g')})  "
        f"truncated {_f(f['truncated_frac'], '.1%')}  "
        f"clipped {_f(f['clipped_frac'], '.1%')}  token ages 0/1/2/3/4+ {ages}  "
        f"straggler wait {f['straggler_wait_s']:.0f}s  turns {_f(f['turns_mean'], '.2f')}"
    )


def parse_mode(spec: str) -> tuple[str, int]:
    """A ``--modes`` entry: the mode's name and its substeps (``correct/4`` → ``("correct", 4)``)."""
    name, slash, count = spec.partition("/")
    if name not in MODES or (slash and not (count.isdigit() and int(count) >= 1)):
        raise ValueError(spec)
    return name, int(count) if slash else 1


def run_mode(spec: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One run of mode ``spec`` (a name, ``/N`` for N substeps): its figures."""
    name, substeps = parse_mode(spec)
    settings = DemoSettings(
        out=out,
        steps=100_000,
        workers=args.workers,
        max_seconds=args.seconds,
        max_staleness=args.max_staleness,
        group_size=args.group_size,
        groups_per_batch=args.groups_per_batch,
        learning_rate=args.learning_rate,
        model=args.model,
        num_substeps=substeps,
        heldout_samples=0,  # the figures come from the sampled rollouts
        seed=args.seed,
    )
    stack, config, options = demo_configs(settings)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    follow = dict(MODES[name])
    inflight = follow.pop("inflight")  # the endpoint's; the rest are the follow trainer's
    env = {"PYTHONPATH": path, TOOL_ENV: str(args.tool_seconds)}
    stack = dataclasses.replace(stack, agent_module=args.agent, worker_env=env, inflight=inflight)
    options = dataclasses.replace(options, max_steps=None, **follow)
    summary = run_demo(settings, console=Console(file=io.StringIO()), configs=(stack, config, options))
    rows = [r for p in sorted((out / "agents").glob("worker-*.jsonl")) for r in read_jsonl(p, skip_bad=True)]
    return figures(rows, summary, args.threshold, args.window, args.seconds)


def variant(args: argparse.Namespace) -> str:
    """The result's variant: the agent when not the long-tail one, and the tool wait when set."""
    parts = [] if args.agent == AGENT else [record.slug(args.agent.rsplit(".", 1)[-1])]
    parts += [f"tool{args.tool_seconds:g}s"] if args.tool_seconds else []
    return "-".join(parts).replace(".", "_")


def record_modes(
    result: record.Result, runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace
) -> None:
    """Each mode's figures, medians over its runs (a threshold never reached counts as the horizon)."""
    for spec, rows in runs.items():
        key, what = record.slug(spec), f"{spec}: median of {len(rows)} run(s) of {args.seconds:.0f} s"

        def median(name: str, default: float, r: list[dict[str, Any]] = rows) -> float:
            return float(np.median([default if x[name] is None else x[name] for x in r]))

        reached = sum(x["to_threshold_s"] is not None for x in rows)
        result.add(f"{key}_to_threshold_s", median("to_threshold_s", args.seconds), "s",
                   f"{what}: to reward {args.threshold} ({reached} of {len(rows)} reached it)")  # fmt: skip
        result.add(f"{key}_final_reward", median("final_reward", 0.0), "", f"{what}: reward, last quarter")
        result.add(
            f"{key}_trained_frac", median("trained_frac", 0.0), "", f"{what}: sampled rollouts trained"
        )
        result.add(f"{key}_lag_p95_s", median("lag_p95_s", 0.0), "s", f"{what}: rollout end → trained, p95")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    modes_help = f"comma-separated, of {', '.join(MODES)}; NAME/N: N substeps per step"
    parser.add_argument("--modes", default="sync,drop,correct", help=modes_help)
    parser.add_argument("--pairs", type=int, default=1, help="interleaved rounds of every mode")
    parser.add_argument("--seconds", type=float, default=150, help="training seconds per run (the horizon)")
    parser.add_argument("--workers", type=int, default=4, help="agent worker processes (a group of 8 each)")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--groups-per-batch", type=int, default=4)
    parser.add_argument("--model", default=DEMO_MODEL, help="the built-in model's size, or another model")
    parser.add_argument("--max-staleness", type=int, default=1, help="the bound of drop and correct")
    parser.add_argument("--learning-rate", type=float, default=3e-3)
    parser.add_argument("--threshold", type=float, default=0.3, help="reward the sampled rollouts must reach")
    parser.add_argument("--window", type=int, default=64, help="sampled rollouts in the reward's moving mean")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tool-seconds", type=float, default=0.0, help="long-tail agent: wait before each turn but the first"
    )
    parser.add_argument("--agent", default=AGENT, help="the agent workers' module (a DEMO_TASK's)")
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(__file__, MEASURES, args, variant=variant(args))
    modes = args.modes.split(",")
    for spec in modes:
        try:
            parse_mode(spec)
        except ValueError:
            parser.error(f"unknown mode {spec!r} (known: {', '.join(MODES)}, each optionally /N)")
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"machine: {platform.machine()} {platform.processor()}, {os.cpu_count()} cores; load {load}")
    print(
        f"each run: {args.seconds:.0f}s of training, {args.workers} workers × groups of {args.group_size}, "
        f"{args.groups_per_batch} groups per step, agent {args.agent}, model {args.model}, "
        f"lr {args.learning_rate:g}, "
        f"seed {args.seed}, bound {args.max_staleness}, tool wait {args.tool_seconds:g}s, "
        f"threshold {args.threshold} over {args.window} rollouts"
    )
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in modes}
    for pair in range(args.pairs):
        for name in modes:
            with tempfile.TemporaryDirectory(prefix="tt-async-sync-") as tmp:
                row = run_mode(name, args, Path(tmp))
            load = os.getloadavg()[0]
            print(f"[{pair + 1}] {row_text(name, row)}  (load {load:.1f})", flush=True)
            runs[name].append(row)
    record_modes(result, runs, args)
    result.save()


if __name__ == "__main__":
    main()
