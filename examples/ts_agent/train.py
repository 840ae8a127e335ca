"""Train the TypeScript agent (``examples/ts_agent/src/agent.ts``) end to end, its code unchanged.

``python examples/ts_agent/train.py --out runs/ts --steps 20`` (after ``make ts-agent``): the sampling
endpoint serves the built-in model in this process and records every call it answers into
``OUT/spans`` (:class:`~tinkertrace.serving.recording.CallRecorder`); Node agent workers call it with
the official ``openai`` package, each rollout under its URL prefix, and post their rewards and ends
over HTTP; the follow trainer trains on those server-recorded rollouts as they complete and publishes
each new policy to the endpoint, which the next rollouts sample from. No tinkertrace code runs in the
agent, and no collector is needed (the endpoint writes Parquet itself; ``--collector`` sends there).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `examples` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tinkertrace.models.builtin import DEMO_MODEL
from tinkertrace.models.tokenizer import load_tokenizer
from tinkertrace.netutil import BackgroundServer
from tinkertrace.online.follow import FollowTrainer
from tinkertrace.online.publish import holder_publisher
from tinkertrace.online.settings import FollowSettings
from tinkertrace.serving.app import create_app
from tinkertrace.serving.policy import PolicyHolder
from tinkertrace.serving.recording import CallRecorder
from tinkertrace.training.config import TrainSettings

HERE = Path(__file__).resolve().parent
AGENT_JS = HERE / "dist" / "agent.js"


def agent_command(endpoint: str, model: str, worker: int, group_size: int, max_tokens: int) -> list[str]:
    """The Node worker's command line (``make ts-agent`` builds ``dist/agent.js``)."""
    if not AGENT_JS.exists():
        raise FileNotFoundError(f"{AGENT_JS} is missing: run `make ts-agent` (Node, npm packages, tsc)")
    return [
        "node",
        str(AGENT_JS),
        "--endpoint",
        endpoint,
        "--model",
        model,
        "--worker",
        str(worker),
        "--group-size",
        str(group_size),
        "--max-tokens",
        str(max_tokens),
    ]


def train(
    out: Path,
    *,
    steps: int = 20,
    workers: int = 2,
    group_size: int = 4,
    groups_per_batch: int = 2,
    model: str = DEMO_MODEL,
    max_tokens: int = 20,
    learning_rate: float = 3e-3,
    max_seconds: float = 600.0,
    collector: str | None = None,
) -> dict[str, Any]:
    """Serve, run the Node workers, follow-train ``steps`` steps; returns the run's summary."""
    from tinkertrace.engine import ServiceClient

    for folder in ("spans", "agents", "engine"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    service = ServiceClient(base_dir=out / "engine")
    holder = PolicyHolder(
        service.create_sampling_client(base_model=model),
        load_tokenizer(model),
        model,
        loader=lambda path: service.create_sampling_client(model_path=path),
    )
    recorder = CallRecorder(collector=collector, spans_dir=out / "spans", schedule_delay_s=0.05, roll_s=0.25)
    server = BackgroundServer(create_app(holder, recorder=recorder, default_max_tokens=max_tokens)).start()
    config = TrainSettings(
        source=out / "spans",
        model=model,
        learning_rate=learning_rate,
        groups_per_batch=groups_per_batch,
        log_dir=out / "train",
        engine_dir=out / "engine",
    )
    options = FollowSettings(
        group_size=group_size, group_timeout_s=10.0, max_staleness=2, poll_s=0.25, max_steps=steps
    )
    trainer = FollowTrainer(config, options, publish=holder_publisher(holder), service=service)
    procs = [
        subprocess.Popen(
            agent_command(server.url, model, i, group_size, max_tokens),
            stdout=(out / "agents" / f"worker-{i}.jsonl").open("wb"),
            stderr=(out / "agents" / f"worker-{i}.log").open("wb"),
        )
        for i in range(workers)
    ]
    stop = threading.Event()
    timer = threading.Timer(max_seconds, stop.set)
    timer.start()
    try:
        result = trainer.run(stop=stop, progress=False)
    finally:
        timer.cancel()
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)
        server.stop()
    rows = [json.loads(line) for p in (out / "agents").glob("*.jsonl") for line in p.read_text().splitlines()]
    summary = {
        "steps": result.steps,
        "rollouts_trained": result.rollouts_trained,
        "rollouts_sampled": len(rows),
        "rollouts_failed": sum("error" in r for r in rows),
        "policy_version": holder.version,
        "mean_reward_first_step": _mean(result.rewards[:1]),
        "mean_reward_last_step": _mean(result.rewards[-1:]),
        "rewards_per_step": result.rewards,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="run folder (spans, agents, train, summary)")
    parser.add_argument("--steps", type=int, default=20, help="training steps, each publishes a policy")
    parser.add_argument("--workers", type=int, default=2, help="Node agent worker processes")
    parser.add_argument("--group-size", type=int, default=4, help="rollouts per question (one group)")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="stop training after this long")
    parser.add_argument("--collector", help="also send the recorded spans to this collector")
    args = parser.parse_args()
    summary = train(
        args.out,
        steps=args.steps,
        workers=args.workers,
        group_size=args.group_size,
        max_seconds=args.max_seconds,
        collector=args.collector,
    )
    print(json.dumps({k: v for k, v in summary.items() if k != "rewards_per_step"}, indent=2))


if __name__ == "__main__":
    main()
