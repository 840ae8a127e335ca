"""An agent worker of an example's online run: rounds of rollouts against the sampling endpoint,
spans to the collector. Started by ``examples/train.py`` (through ``OnlineStack.start_workers``,
which passes the endpoint, collector, worker number and log file; the example config comes in
``$TINKERTRACE_EXAMPLE_CONFIG``, overrides as JSON in ``$TINKERTRACE_EXAMPLE_OVERRIDES``).

Each round picks an environment (round-robin) and one of its training tasks, and runs the agent
``rollouts_per_task`` times at once: one GRPO group, whose task id names the environment, the task
and the round (:func:`examples.runconfig.group_task_id`). One JSON line per rollout goes to ``--log``;
SIGTERM ends the worker after its current round.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import threading
from pathlib import Path

import tinkertrace
from examples.runconfig import RunConfig, group_task_id, load_config
from tinkertrace.rollouts import load_ref, load_tasks, run_rollouts

CONFIG_ENV = "TINKERTRACE_EXAMPLE_CONFIG"
OVERRIDES_ENV = "TINKERTRACE_EXAMPLE_OVERRIDES"


def run_worker(
    config: RunConfig, base_url: str, worker: int, log: Path, stop: threading.Event, parent_pid: int | None
) -> int:
    """Rounds of rollout groups until ``stop`` is set or the parent process is gone; rounds run."""
    envs = config.environments
    agents = {env.name: load_ref(env.agent) for env in envs}
    tasks = {env.name: load_tasks(env.tasks, split=env.split) for env in envs}
    rng = random.Random(f"{config.seed}/worker-{worker}")
    rounds = 0
    with log.open("a") as out:
        while not stop.is_set() and (parent_pid is None or os.getppid() == parent_pid):
            env = envs[(worker + rounds) % len(envs)]
            task = rng.choice(tasks[env.name])
            group = {**task, "id": group_task_id(env.name, task["id"], f"w{worker}r{rounds}")}
            kwargs = {"base_url": base_url, "model": config.model, "temperature": env.temperature}
            results = run_rollouts(
                agents[env.name],
                [group],
                samples_per_task=env.rollouts_per_task,
                agent_kwargs={**kwargs, **env.agent_kwargs},
                concurrency=env.rollouts_per_task,
            )
            for result in results:
                row = {"env": env.name, "task_id": result.task_id, "reward": result.reward}
                row.update(error=result.error, worker=worker, round=rounds)
                out.write(json.dumps(row) + "\n")
            out.flush()
            rounds += 1
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True, help="OpenAI-compatible endpoint (…/v1)")
    parser.add_argument("--collector", required=True, help="OTLP/HTTP collector URL")
    parser.add_argument("--model", default=None, help="model name to request (default: the config's)")
    parser.add_argument("--worker", type=int, default=0, help="worker number (varies the tasks)")
    parser.add_argument("--log", type=Path, required=True, help="JSON-lines file of rollout results")
    parser.add_argument("--group-size", type=int, default=None, help="ignored: rollouts_per_task rules")
    parser.add_argument("--max-tokens", type=int, default=None, help="ignored: the agents set their own")
    parser.add_argument("--export-delay", type=float, default=0.1, help="span export delay, seconds")
    args = parser.parse_args()
    config = load_config(Path(os.environ[CONFIG_ENV]), json.loads(os.environ.get(OVERRIDES_ENV) or "{}"))
    if args.model:
        config.model = args.model
    tinkertrace.init(endpoint=args.collector, schedule_delay_s=args.export_delay)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    run_worker(config, args.base_url, args.worker, args.log, stop, os.getppid())
    tinkertrace.shutdown()


if __name__ == "__main__":
    main()
