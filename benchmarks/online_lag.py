"""Online loop figures: rollout-end → trained lag (p50/p95) and endpoint throughput with N agents.

Starts the real stack (collector subprocess, local-engine endpoint, N agent worker processes running
the demo's identity agent), trains in follow mode for ``--steps`` steps publishing each version into
the endpoint, and prints:

- lag: seconds from a rollout's end (its root span) to the end of the step that trained it;
- endpoint throughput: completions/s and completion tokens/s over the agents' active time;
- rollouts sampled / trained / dropped as stale, and the step time.

Usage: ``python benchmarks/online_lag.py --workers 2 --steps 15``
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from tinkertrace.online.follow import FollowOptions, FollowTrainer, holder_publisher
from tinkertrace.online.runner import OnlineStack, StackSettings
from tinkertrace.training.config import TrainConfig
from tinkertrace.training.metrics import read_metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2, help="concurrent agent worker processes")
    parser.add_argument("--steps", type=int, default=15, help="training steps to run")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per group")
    parser.add_argument("--groups-per-batch", type=int, default=4, help="groups per step")
    parser.add_argument("--model", default="tinkertrace/tiny-chat:small", help="built-in model size")
    parser.add_argument("--max-seconds", type=float, default=240, help="stop training after this long")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="tt-online-bench-") as tmp:
        out = Path(tmp)
        settings = StackSettings(out=out, model=args.model, group_size=args.group_size)
        config = TrainConfig(
            source=settings.spans_dir,
            model=args.model,
            learning_rate=5e-3,
            groups_per_batch=args.groups_per_batch,
            log_dir=out / "train",
            engine_dir=settings.engine_dir,
        )
        options = FollowOptions(
            group_size=args.group_size, group_timeout_s=10, max_staleness=3, poll_s=0.25, max_steps=args.steps
        )
        with OnlineStack(settings) as stack:
            trainer = FollowTrainer(
                config, options, publish=holder_publisher(stack.holder), service=stack.service
            )
            stop = threading.Event()
            timer = threading.Timer(args.max_seconds, stop.set)
            stack.start_workers(args.workers)
            timer.start()
            started = time.monotonic()
            result = trainer.run(stop=stop, progress=False)
            elapsed = time.monotonic() - started
            timer.cancel()
            stack.stop_workers()
            rows = [r for r in stack.agent_results() if "reward" in r]
        step_times = [m["time/step"] for m in read_metrics(out / "train")]

    span = max(r["end"] for r in rows) - min(r["start"] for r in rows)
    tokens = sum(int(r.get("completion_tokens") or 0) for r in rows)
    lag = np.asarray(result.lags_s)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores (shared with other work if any)")
    print(
        f"setup: {args.workers} workers x {args.group_size} concurrent rollouts, {args.model}, "
        f"{args.groups_per_batch} groups/step"
    )
    print(f"steps: {result.steps} in {elapsed:.1f}s, step time mean {np.mean(step_times):.2f}s")
    print(
        f"rollouts: sampled {len(rows)}, trained {result.rollouts_trained}, "
        f"dropped stale {result.rollouts_dropped_stale}"
    )
    print(f"lag rollout end -> trained: p50 {np.percentile(lag, 50):.2f}s  p95 {np.percentile(lag, 95):.2f}s")
    print(f"endpoint throughput: {len(rows) / span:.1f} completions/s, {tokens / span:.0f} tokens/s")


if __name__ == "__main__":
    main()
