"""Reward assignment (``builder/rewards.py``) on hand-made call and reward tables: each policy's
pairing, only trainable calls taking rewards, and the counts of matched, superseded and unmatched
rewards; plus agent scoping through a whole build."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pytest

from tinkertrace.builder import BuildSettings, build_trajectories
from tinkertrace.builder.rewards import assign_rewards, count_rewards
from tinkertrace.builder.summary import BuildSummary

from .conftest import SpanRows

_CALL = {"trace_id": "t", "rollout_id": "r1", "response_id": None, "parent": None, "scope": None,
         "trainable": True}  # fmt: skip
_REWARD = {"trace_id": "t", "rollout_id": "r1", "linked_response_id": None, "parent": None, "scope": None,
           "is_final": False}  # fmt: skip


def _call(span: str, start: float, end: float, **cols: Any) -> dict[str, Any]:
    return {**_CALL, "span_id": span, "start_time": start, "end_time": end, **cols}


def _reward(span: str, at: float, v: float | None, **cols: Any) -> dict[str, Any]:
    return {**_REWARD, "span_id": span, "start_time": at, "end_time": at, "v": v, **cols}


def _tables(
    con: duckdb.DuckDBPyConnection, calls: list[dict[str, Any]], rewards: list[dict[str, Any]]
) -> None:
    for name, rows in (("calls", calls), ("rewards", rewards)):
        con.register(f"{name}_arrow", pa.Table.from_pylist(rows))
        con.execute(f"CREATE TABLE {name} AS SELECT * FROM {name}_arrow")


def _pairs(con: duckdb.DuckDBPyConnection, policy: str) -> dict[str, str]:
    assigned = assign_rewards(con, "calls", "rewards", policy)  # type: ignore[arg-type]
    return dict(con.execute(f"SELECT reward_span_id, call_span_id FROM {assigned}").fetchall())


# Two calls, then a reward linked to the first call's response, then a reward flagged final.
_CALLS = [_call("c0", 0, 1, response_id="x0"), _call("c1", 2, 3, response_id="x1")]
_REWARDS = [_reward("w0", 4, 0.5, linked_response_id="x0"), _reward("w1", 5, 1.0, is_final=True)]


@pytest.mark.parametrize(
    ("policy", "pairs"),
    [
        ("nearest", {"w0": "c1", "w1": "c0"}),  # each reward takes the newest call not yet rewarded
        ("sibling", {"w0": "c1", "w1": "c0"}),  # the same, all under one parent
        ("link", {"w0": "c0", "w1": "c1"}),  # w0 by its response id, w1 the nearest call left
    ],
)
def test_policies_pair_each_reward_with_one_call(policy: str, pairs: dict[str, str]) -> None:
    con = duckdb.connect()
    _tables(con, _CALLS, _REWARDS)
    assert _pairs(con, policy) == pairs


def test_final_gives_the_final_reward_to_every_call_and_supersedes_the_others() -> None:
    con = duckdb.connect()
    _tables(con, _CALLS, _REWARDS)
    assigned = assign_rewards(con, "calls", "rewards", "final")
    rows = con.execute(f"SELECT reward_span_id, call_span_id, v FROM {assigned} ORDER BY 2").fetchall()
    assert rows == [("w1", "c0", 1.0), ("w1", "c1", 1.0)]
    summary = BuildSummary()
    count_rewards(con, "calls", "rewards", assigned, BuildSettings(reward_policy="final"), summary)
    assert (summary.rewards_matched, summary.rewards_superseded, summary.rewards_unmatched) == (1, 1, 0)


def test_sibling_pairs_only_under_the_same_parent() -> None:
    con = duckdb.connect()
    calls = [_call("c0", 0, 1, parent="a"), _call("c1", 2, 3, parent="b")]
    _tables(con, calls, [_reward("w0", 4, 1.0, parent="a")])
    assert _pairs(con, "sibling") == {"w0": "c0"}
    assert _pairs(con, "nearest") == {"w0": "c1"}  # nearest ignores parents


def test_nearest_stays_in_the_rewards_agent_scope_first() -> None:
    con = duckdb.connect()
    calls = [_call("c0", 0, 1, scope="a"), _call("c1", 2, 3, scope="b")]
    rewards = [_reward("w0", 4, 1.0, scope="a"), _reward("w1", 5, 1.0, scope="a")]
    _tables(con, calls, rewards)
    # w0 takes a's call; w1 finds a's calls taken and falls back to the rollout's free one
    assert _pairs(con, "nearest") == {"w0": "c0", "w1": "c1"}


def test_untrainable_calls_take_no_reward_and_unmatched_rewards_are_listed() -> None:
    con = duckdb.connect()
    calls = [_call("c0", 0, 1), _call("c1", 2, 3, trainable=False)]
    rewards = [_reward("w0", 4, 1.0), _reward("w1", 5, 2.0), _reward("w2", 6, None)]  # w2: no value
    _tables(con, calls, rewards)
    assigned = assign_rewards(con, "calls", "rewards", "nearest")
    assert dict(con.execute(f"SELECT reward_span_id, call_span_id FROM {assigned}").fetchall()) == {
        "w0": "c0"
    }
    summary = BuildSummary()
    count_rewards(con, "calls", "rewards", assigned, BuildSettings(), summary)
    assert (summary.rewards_matched, summary.rewards_unmatched) == (1, 1)
    assert summary.unmatched_rewards == [("r1", "w1")]  # a reward without a value is not counted


def test_rewards_stay_in_their_agent_span(tmp_path: Path, rows: SpanRows) -> None:
    root = rows.rollout("r1", llm_calls=2, rewards=1)
    a = rows.span(trace="r1", name="invoke_agent a", start=1, end=50, parent=root, span_type="agent",
                  rollout_id="r1", agent_name="a")  # fmt: skip
    rows.llm("r1", a, [1, 2], [3], start=2, end=3, agent="a")
    b = rows.span(trace="r1", name="invoke_agent b", start=4, end=9, parent=root, span_type="agent",
                  rollout_id="r1", agent_name="b")  # fmt: skip
    rows.llm("r1", b, [5, 6], [7], start=5, end=6, agent="b")
    rows.reward("r1", a, 1.0, at=10, agent="a")  # after b's call, but a's own
    rows.write(tmp_path)
    for policy in ("nearest", "sibling", "link"):
        result = build_trajectories(tmp_path, None, BuildSettings(reward_policy=policy))  # type: ignore[arg-type]
        assert result.triplets.column("reward").to_pylist() == [1.0, None]
    # a second reward in a's span finds a's only call taken: it falls back to the rollout's nearest
    rows.reward("r1", a, 0.5, at=11, agent="a")
    rows.reward("r1", root, 0.25, at=60)  # outside any agent span: nearest free call, none left
    rows.write(tmp_path, "part-1.parquet")
    result = build_trajectories(tmp_path)
    assert result.triplets.column("reward").to_pylist() == [1.0, 0.5]
    assert (result.summary.rewards_matched, result.summary.rewards_unmatched) == (2, 1)
