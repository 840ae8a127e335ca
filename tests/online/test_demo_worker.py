"""The demo's agent worker runs whole groups, two at a time: a long episode holds up its own group,
not the next ones (a worker that ran one group at a time waited for each group's longest rollout, so
every training mode waited for stragglers at the agents)."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tinkertrace.online.demo_agent import DemoTask, run_worker
from tinkertrace.testing.waiting import wait_until


def test_a_long_rollout_does_not_hold_up_the_next_groups(tmp_path: Path) -> None:
    order = itertools.count()

    def rollout(task: dict[str, Any], **_: Any) -> dict[str, Any]:
        n = next(order)
        time.sleep(1.5 if n == 0 else 0.02)  # the first rollout is the long episode
        if n == 5:
            raise RuntimeError("the endpoint went away")  # logged, and the worker goes on
        return {"reward": 1.0, "task": task["id"], "n": n}

    task = DemoTask(lambda worker, group, seed: {"id": f"w{worker}-g{group}-s{seed}"}, rollout)
    log, stop = tmp_path / "worker.jsonl", threading.Event()
    result: list[int] = []
    thread = threading.Thread(
        target=lambda: result.append(
            run_worker("http://127.0.0.1:9/v1", "m", 3, log, task=task, group_size=4, seed=7, stop=stop)
        )
    )
    thread.start()
    wait_until(lambda: log.exists() and len(log.read_text().splitlines()) >= 20, timeout=10)
    stop.set()
    thread.join(timeout=10)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    long = next(r for r in rows if r.get("n") == 0)
    assert long["end"] - long["start"] >= 1.5
    # groups after the first one finished while the long episode still ran: no barrier between groups
    assert sum(r["end"] < long["end"] for r in rows if r["round"] >= 2) >= 4
    sizes = Counter(r["round"] for r in rows)
    assert set(sizes.values()) == {4}  # whole groups of 4: the groups in flight at the stop finished too
    for group in sizes:  # each group started whole
        starts = [r["start"] for r in rows if r["round"] == group]
        assert max(starts) - min(starts) < 0.5
    assert {r["task"] for r in rows if r["round"] == 2 and "task" in r} == {"w3-g2-s7"}
    assert [r["error"] for r in rows if "error" in r] == ["RuntimeError: the endpoint went away"]
    assert {r["worker"] for r in rows} == {3} and result == [max(sizes) + 1]
