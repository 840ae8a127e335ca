"""The long-tail multi-turn example: episode lengths from 1 to 10 turns with a heavy tail, each
episode one merged trajectory with the mean identity reward over its turns."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from openai import OpenAI

import tinkertrace
from examples.long_tail import agent
from examples.long_tail.agent import MAX_TURNS, episode, episode_turns, turn_weights
from tinkertrace.builder import build_trajectories
from tinkertrace.online.demo_agent import TARGET, identity_reward


def test_lengths_have_a_heavy_tail_up_to_ten_turns() -> None:
    weights = turn_weights()
    assert all(a > b for a, b in itertools.pairwise(weights)) and abs(sum(weights) - 1) < 1e-12
    counts = Counter(episode_turns(f"seed-{i}") for i in range(4000))
    assert set(counts) == set(range(1, MAX_TURNS + 1))
    assert 0.45 < counts[1] / 4000 < 0.55 and counts[MAX_TURNS] > 20  # most short, a few long


def test_an_episode_is_one_trajectory_of_its_turns_with_the_mean_reward(
    openai_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent, "_draws", itertools.count())  # lengths drawn: 2, 1, 5, 3, 2, 5, 1, 1
    openai_server.options.responder = lambda req: TARGET if len(req.messages) < 5 else "I am"
    spans = tmp_path / "spans"
    tinkertrace.init(spans_dir=spans)
    client = OpenAI(base_url=openai_server.base_url, api_key="EMPTY")
    task = {"id": "longtail-test"}
    rows = [episode(task, client=client, model="test-model", max_tokens=40) for _ in range(8)]
    tinkertrace.flush()
    assert [r["turns"] for r in rows] == [episode_turns(f"longtail-test/{i}") for i in range(8)]
    assert max(r["turns"] for r in rows) >= 3
    for row in rows:  # turns 1 and 2 answer right (reward 1), later ones "I am" (less)
        late = max(0, row["turns"] - 2)
        want = (min(row["turns"], 2) + late * identity_reward("I am")) / row["turns"]
        assert row["reward"] == pytest.approx(want)
    sizes = Counter(len(r["messages"]) for r in openai_server.requests)
    assert sizes[2 * 5 - 1] == 2  # the 5th turn of each 5-turn episode sends the whole chat so far
    traj = build_trajectories(spans).trajectories.drop_columns(["end_time"]).to_pylist()
    assert sorted((t["num_turns"], t["reward"]) for t in traj) == sorted(
        (r["turns"], r["reward"]) for r in rows
    )


def test_tool_wait_delays_every_turn_but_the_first(
    openai_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits: list[float] = []
    monkeypatch.setattr(agent, "time", SimpleNamespace(sleep=waits.append))  # this module's only
    monkeypatch.setenv(agent.TOOL_ENV, "0.25")
    monkeypatch.setattr(agent, "_draws", itertools.count(2))  # the third draw of the test above: 5 turns
    openai_server.options.responder = lambda req: TARGET
    tinkertrace.init(spans_dir=tmp_path / "spans")
    client = OpenAI(base_url=openai_server.base_url, api_key="EMPTY")
    row = episode({"id": "longtail-test"}, client=client, model="test-model", max_tokens=40)
    assert row["turns"] == 5 and waits == [0.25] * 4
    monkeypatch.delenv(agent.TOOL_ENV)
    waits.clear()
    episode({"id": "longtail-test"}, client=client, model="test-model", max_tokens=40)
    assert waits == []
