"""The agent worker of `train --follow` over environments: environments taken in turn by weight,
one group of ``group_size`` rollouts per round under an ``ENV/TASK/RUNwWrR`` task id, the agent called
with the environment's sampling settings."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tinkertrace.online.env_worker import run_worker
from tinkertrace.testing.waiting import wait_until

AGENT = """
import json

def agent(task, *, calls, **settings):
    with open(calls, "a") as out:
        out.write(json.dumps({"task": task["id"], **settings}) + "\\n")
    return 1.0 if task["id"].startswith("a/") else 0.0

def tasks(split="train"):
    return [{"id": f"{split}-{i}"} for i in range(3)]
"""


@contextmanager
def worker_thread(environments: list[dict], log: Path) -> Iterator[tuple[threading.Thread, threading.Event]]:
    """``run_worker`` in a thread over ``environments`` (run "abc", model "m"), logging to ``log``;
    yields the thread and its stop event, and stops it on exit."""
    spec = {"model": "m", "seed": 0, "run": "abc", "environments": environments}
    stop = threading.Event()
    worker = threading.Thread(target=run_worker, args=(spec, "http://x/v1", 0, log, stop, None))
    worker.start()
    try:
        yield worker, stop
    finally:
        stop.set()
        worker.join(30)


def test_worker_runs_groups_by_weight(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text(AGENT)
    calls, log = tmp_path / "calls.jsonl", tmp_path / "worker.jsonl"
    env = {
        "agent": f"{tmp_path / 'agent.py'}:agent",
        "tasks": f"{tmp_path / 'agent.py'}:tasks",
        "split": "train",
    }
    environments: list[dict] = [
        {**env, "name": "a", "weight": 3, "group_size": 2, "temperature": 0.5, "max_tokens": 7,
         "agent_kwargs": {"calls": str(calls)}},
        {**env, "name": "b", "weight": 1, "group_size": 3, "temperature": 1.0, "max_tokens": None,
         "agent_kwargs": {"calls": str(calls)}},
    ]  # fmt: skip
    with worker_thread(environments, log):
        wait_until(lambda: log.exists() and len(log.read_text().splitlines()) >= 9, 30, "four rounds logged")
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    rounds = [[r for r in rows if r["round"] == k] for k in range(4)]
    assert [(group[0]["env"], len(group)) for group in rounds] == [("a", 2), ("a", 2), ("b", 3), ("a", 2)]
    for k, group in enumerate(rounds):
        (task_id,) = {r["task_id"] for r in group}
        env, task, tag = task_id.split("/")
        assert env == group[0]["env"] and task.startswith("train-") and tag == f"abcw0r{k}"
    settings = [json.loads(line) for line in calls.read_text().splitlines()]
    a_call = next(c for c in settings if c["task"].startswith("a/"))
    b_call = next(c for c in settings if c["task"].startswith("b/"))
    assert (a_call["temperature"], a_call["max_tokens"], a_call["model"]) == (0.5, 7, "m")
    assert b_call["temperature"] == 1.0 and "max_tokens" not in b_call
    assert all(c["base_url"] == "http://x/v1" for c in settings)
    assert [r["reward"] for r in rounds[0]] == [1.0, 1.0] and [r["reward"] for r in rounds[2]] == [0.0] * 3


HELD_AGENT = """
import itertools, os, time

_calls = itertools.count()

def agent(task, *, release, **settings):
    if next(_calls) == 1:  # the round's second rollout waits for the test
        while not os.path.exists(release):
            time.sleep(0.01)
    return 0.5

def tasks(split="train"):
    return [{"id": "t"}]
"""


def test_a_finished_rollout_is_logged_before_its_round_ends(tmp_path: Path) -> None:
    agent = tmp_path / "agent.py"
    agent.write_text(HELD_AGENT)
    log, release = tmp_path / "worker.jsonl", tmp_path / "release"
    environment = {
        "name": "a", "agent": f"{agent}:agent", "tasks": f"{agent}:tasks", "split": "train", "weight": 1,
        "group_size": 2, "temperature": 1.0, "max_tokens": None, "agent_kwargs": {"release": str(release)},
    }  # fmt: skip
    with worker_thread([environment], log) as (worker, stop):
        try:
            wait_until(
                lambda: log.exists() and log.read_text().count("\n") == 1, 30, "the first rollout logged"
            )
            (row,) = [json.loads(line) for line in log.read_text().splitlines()]
            assert worker.is_alive() and (row["round"], row["reward"], row["error"]) == (0, 0.5, None)
        finally:
            stop.set()  # the round ends when the held rollout is released; no round after it
            release.touch()
    assert [json.loads(line)["round"] for line in log.read_text().splitlines()] == [0, 0]
