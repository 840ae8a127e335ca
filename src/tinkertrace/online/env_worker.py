"""An agent worker of ``tinkertrace train --follow`` over environments: rounds of rollout groups
against the sampling endpoint, spans to the collector.

Started by :func:`tinkertrace.online.environments.train_with_agents` (through
``OnlineStack.start_workers``, which passes the endpoint, collector, worker number and log file; the
environments come in the JSON file named by ``$TINKERTRACE_ENVIRONMENTS``). Each round takes the
next environment by weight (:class:`~tinkertrace.training.environments.WeightedTurns`, offset by
the worker number) and one of its tasks, and runs the agent ``group_size`` times at once: one GRPO
group, whose task id names the environment, the task and the round. As the demo's workers do
(:func:`~tinkertrace.online.groups_in_flight.run_groups`), a worker runs two groups at a time and
starts the next as soon as one is done, so a long episode holds up its own group, not the worker.
One JSON line per rollout goes to ``--log`` as the rollout ends. SIGTERM (or SIGINT) abandons the
groups in flight (:func:`~tinkertrace.online.groups_in_flight.run_until_stopped`: an async agent's
rollouts are cancelled, and an ORS episode deletes its session on the way out), sends the spans
recorded so far and ends the worker.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import tinkertrace
from tinkertrace.evaluation.rollouts import RolloutResult, load_ref, load_tasks, run_rollouts_async
from tinkertrace.online.groups_in_flight import run_groups, run_until_stopped
from tinkertrace.training.config import REPLY_TOKENS
from tinkertrace.training.environments import WeightedTurns, group_task_id

SPEC_ENV = "TINKERTRACE_ENVIRONMENTS"


def agent_arguments(env: dict[str, Any], base_url: str, model: str) -> dict[str, Any]:
    """The keyword arguments an environment's agent gets: endpoint, model, sampling settings (and an
    OpenReward environment's reference, turn limit and reply cap, :data:`REPLY_TOKENS` unless it sets
    one), its own."""
    kwargs = {"base_url": base_url, "model": model, "temperature": env["temperature"]}
    if env.get("max_tokens") is not None:
        kwargs["max_tokens"] = env["max_tokens"]
    if env.get("openreward"):
        kwargs |= {"openreward": env["openreward"], "max_turns": env["max_turns"]}
        kwargs.setdefault("max_tokens", REPLY_TOKENS)
    return {**kwargs, **env["agent_kwargs"]}


def environment_tasks(env: dict[str, Any], seed: int) -> list[dict]:
    """An environment's tasks: its split (from the server, for an OpenReward environment), shuffled
    (seeded) when asked, the first ``num_samples`` kept."""
    options = {"openreward": env["openreward"]} if env.get("openreward") else {}
    tasks = load_tasks(env["tasks"], split=env["split"], **options)
    if env.get("shuffle", True):
        random.Random(f"{seed}/{env['name']}/{env['split']}").shuffle(tasks)
    return tasks[: env.get("num_samples")]


def log_line(out: TextIO, lock: threading.Lock, tags: dict[str, Any], result: RolloutResult) -> None:
    """One rollout's JSON line, flushed as the rollout ends: a worker killed mid-round loses no line of
    a rollout that finished (its spans are in the collector already)."""
    row = {**tags, "task_id": result.task_id, "reward": result.reward, "error": result.error}
    with lock:
        out.write(json.dumps(row) + "\n")
        out.flush()


def run_worker(
    spec: dict[str, Any], base_url: str, worker: int, log: Path, stop: threading.Event, parent_pid: int | None
) -> int:
    """Rounds of rollout groups, two at a time (:func:`run_groups`), until ``stop`` is set (the groups in
    flight are abandoned) or the parent process is gone (they finish); rounds started."""
    envs = [env for env in spec["environments"] if env.get("agent")]
    agents = {env["name"]: load_ref(env["agent"]) for env in envs}
    tasks = {env["name"]: environment_tasks(env, spec["seed"]) for env in envs}
    rng = random.Random(f"{spec['seed']}/{spec['run']}/worker-{worker}")
    turns = WeightedTurns([env["weight"] for env in envs])
    turns.skip(worker)
    writing = threading.Lock()
    rounds = 0

    def next_round() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """The next group to run: its environment, its task with its group id, its log tags."""
        nonlocal rounds
        env = envs[turns.next()]
        task = rng.choice(tasks[env["name"]])
        group = {**task, "id": group_task_id(env["name"], task["id"], f"{spec['run']}w{worker}r{rounds}")}
        tags = {"env": env["name"], "worker": worker, "round": rounds}
        rounds += 1
        return env, group, tags

    def run_round(picked: tuple[dict[str, Any], dict[str, Any], dict[str, Any]]) -> None:
        env, group, tags = picked
        rollouts = partial(
            run_rollouts_async,
            agents[env["name"]],
            [group],
            samples_per_task=env["group_size"],
            agent_kwargs=agent_arguments(env, base_url, spec["model"]),
            concurrency=env["group_size"],
            on_result=partial(log_line, out, writing, tags),
        )
        run_until_stopped(rollouts, stop)

    with log.open("a") as out:
        run_groups(next_round, run_round, stop, parent_pid)
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True, help="OpenAI-compatible endpoint (…/v1)")
    parser.add_argument("--collector", required=True, help="OTLP/HTTP collector URL")
    parser.add_argument("--model", default=None, help="model name to request (default: the spec's)")
    parser.add_argument("--worker", type=int, default=0, help="worker number (varies the tasks)")
    parser.add_argument("--log", type=Path, required=True, help="JSON-lines file of rollout results")
    parser.add_argument("--group-size", type=int, default=None, help="ignored: each environment's rules")
    parser.add_argument("--max-tokens", type=int, default=None, help="ignored: each environment's rules")
    parser.add_argument("--export-delay", type=float, default=0.1, help="span export delay, seconds")
    args = parser.parse_args()
    spec = json.loads(Path(os.environ[SPEC_ENV]).read_text())
    spec["model"] = args.model or spec["model"]
    tinkertrace.init(endpoint=args.collector, schedule_delay_s=args.export_delay)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):  # SIGINT: a Ctrl-C reaches the whole process group
        signal.signal(signum, lambda *_: stop.set())
    run_worker(spec, args.base_url, args.worker, args.log, stop, os.getppid())
    tinkertrace.shutdown()  # the spans, sent
    sys.stdout.flush()
    os._exit(0)  # everything is written: skip the interpreter's teardown (0.5-1.5 s on 2 busy cores)


if __name__ == "__main__":
    main()
