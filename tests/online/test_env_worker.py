"""The agent worker of `train --follow` over environments: environments taken in turn by weight,
one group of ``group_size`` rollouts per round under an ``ENV/TASK/RUNwWrR`` task id, the agent called
with the environment's sampling settings, two groups at a time."""

from __future__ import annotations

import json
import subprocess
import sys
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


def rows_of(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


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
        wait_until(lambda: len([r for r in rows_of(log) if r["round"] < 4]) == 9, 30, "four rounds logged")
    rows = rows_of(log)
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
import os, threading, time

_round0 = []
_lock = threading.Lock()

def agent(task, *, release, **settings):
    with _lock:
        held = task["id"].endswith("w0r0") and len(_round0) == 1  # round 0's second rollout
        _round0.extend([1] if task["id"].endswith("w0r0") else [])
    while held and not os.path.exists(release):  # waits for the test
        time.sleep(0.01)
    return 0.5

def tasks(split="train"):
    return [{"id": "t"}]
"""


def test_a_held_rollout_holds_its_group_not_the_worker(tmp_path: Path) -> None:
    agent = tmp_path / "agent.py"
    agent.write_text(HELD_AGENT)
    log, release = tmp_path / "worker.jsonl", tmp_path / "release"
    environment = {
        "name": "a", "agent": f"{agent}:agent", "tasks": f"{agent}:tasks", "split": "train", "weight": 1,
        "group_size": 2, "temperature": 1.0, "max_tokens": None, "agent_kwargs": {"release": str(release)},
    }  # fmt: skip
    with worker_thread([environment], log) as (worker, stop):
        try:  # the other place runs round after round while round 0 waits, its first rollout logged
            wait_until(lambda: len(rows_of(log)) >= 7, 30, "three more rounds logged")
            first = [r for r in rows_of(log) if r["round"] == 0]
            assert worker.is_alive() and [(r["reward"], r["error"]) for r in first] == [(0.5, None)]
        finally:
            stop.set()  # the worker ends when the held rollout is released; no round after that
            release.touch()
        worker.join(30)
        ended = rows_of(log)
        assert not worker.is_alive()
    rounds = [r["round"] for r in ended]
    assert rounds.count(0) == 2 and all(rounds.count(k) == 2 for k in set(rounds))  # every group whole
    assert rows_of(log) == ended


def test_the_worker_does_not_need_the_openai_package() -> None:
    """`train --follow` over environments runs with the train extra, which has no openai package (an
    environment's agent may call its endpoint however it likes)."""
    code = "import sys; sys.modules['openai'] = None; import tinkertrace.online.env_worker"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
