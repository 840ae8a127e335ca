"""A live online stack for the follow-mode tests: real collector subprocess, real endpoint."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import duckdb
import pytest
from openai import OpenAI

import tinkertrace
from tinkertrace.online.demo_agent import ask, introduce
from tinkertrace.online.runner import OnlineStack
from tinkertrace.online.settings import StackSettings
from tinkertrace.spanstore.reader import open_spans
from tinkertrace.testing.waiting import wait_until

MODEL = "tinkertrace/tiny-chat:nano"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OnlineStack]:
    out = tmp_path_factory.mktemp("online")
    with OnlineStack(StackSettings(out=out, model=MODEL, group_size=4, max_tokens=6)) as running:
        tinkertrace.init(endpoint=running.collector_url, schedule_delay_s=0.05)
        yield running
        tinkertrace.shutdown()


@tinkertrace.traced_rollout
def rewarded(task: dict, *, client: OpenAI, reward: float) -> None:
    """One traced rollout of ``task`` whose reward is ``reward``, whatever the reply."""
    ask(client, MODEL, task["question"], 6)
    tinkertrace.emit_reward(reward)


def make_rollouts(
    stack: OnlineStack, prefix: str, groups: int, size: int = 4, rewards: Sequence[float] | None = None
) -> set[str]:
    """Run ``groups`` × ``size`` traced identity rollouts (rewarded ``rewards[i]`` for the i-th of a
    group when given: a group whose advantages cannot all be 0); wait until their spans are in files.
    Returns the task ids."""
    client = OpenAI(base_url=stack.base_url, api_key="EMPTY")
    tasks = [{"id": f"{prefix}-{g}", "question": "Who are you?"} for g in range(groups)]
    for task in tasks:
        for i in range(size):
            if rewards is None:
                introduce(task, client=client, model=MODEL, max_tokens=6)
            else:
                rewarded(task, client=client, reward=rewards[i])
    assert tinkertrace.flush()
    wait_until(
        lambda: stored_rollouts(stack.settings.spans_dir, tasks) == groups * size, 30, "rollouts stored"
    )
    return {t["id"] for t in tasks}


def stored_rollouts(spans_dir: Path, tasks: list[dict]) -> int:
    """How many rollout spans of ``tasks`` the collector has written to Parquet files so far."""
    con = duckdb.connect()
    open_spans(con, spans_dir)
    ids = [t["id"] for t in tasks]
    return con.execute(
        "SELECT count(*) FROM spans WHERE span_type = 'rollout' AND list_contains(?, task_id)", [ids]
    ).fetchone()[0]


@pytest.fixture
def engine_dir(stack: OnlineStack) -> Path:
    return stack.settings.engine_dir
