"""A group trained without its stragglers (the group timeout) keeps its rows as their baseline: a
late rollout trains as soon as it arrives, its advantage against the whole group's mean reward, and
the earlier rows are neither trained nor recorded again."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tinkertrace import schemas
from tinkertrace.online.follow import FollowResult, FollowTrainer, reward_only
from tinkertrace.online.settings import FollowSettings
from tinkertrace.training.config import TrainSettings


def rollouts(rewards: dict[str, float], task: str = "t", versions: dict[str, int] | None = None) -> pa.Table:
    """One single-turn rollout per entry (id → reward) of ``task``, sampled by version 0 (or
    ``versions[id]``)."""
    prompt, reply = list(b"Q? "), list(b"yes")
    rows = [
        {
            "rollout_id": rid,
            "task_id": task,
            "agent_name": "solver",
            "group_key": task,
            "segment": 0,
            "tokens": prompt + reply,
            "logprobs": [0.0] * len(prompt) + [-5.5] * len(reply),
            "action_mask": [0] * len(prompt) + [1] * len(reply),
            "reward": reward,
            "num_turns": 1,
            "policy_version": (versions or {}).get(rid, 0),
            "split": "train",
        }
        for rid, reward in rewards.items()
    ]
    return pa.Table.from_pylist(rows, schema=schemas.trajectories())


def follower(tmp_path: Path) -> FollowTrainer:
    config = TrainSettings(source=tmp_path, log_dir=tmp_path / "train", groups_per_batch=1)
    return FollowTrainer(config, FollowSettings(group_size=4, group_timeout_s=0, max_staleness=None))


def test_a_late_rollout_trains_at_once_against_its_groups_baseline(tmp_path: Path) -> None:
    trainer = follower(tmp_path)
    result = FollowResult(log_dir=tmp_path, start_step=0)
    trainer.buffer.add(rollouts({"a": 0.0, "b": 0.0, "c": 1.0}))
    picked = trainer._select(0)  # three of four after the (zero) timeout
    assert picked is not None
    table, ids = picked
    prepared = trainer.data.prepare(table, 0, result)
    assert prepared is not None
    data, rows, kept, _ = prepared
    assert kept == {"a", "b", "c"} and rows.tolist() == [0, 1, 2]
    np.testing.assert_allclose(data.advantage_of_row, [-1 / 3, -1 / 3, 2 / 3])
    trainer.late.carry(table)
    trainer.buffer.consume(ids)
    assert list(trainer.late.carried) == ["t"] and trainer.late.carried["t"].num_rows == 3

    trainer.buffer.add(rollouts({"d": 1.0}))  # the straggler: ready alone (a group of one is not, else) ...
    assert trainer.late.late_in(trainer.buffer.table) == 1
    assert trainer._select(1) is None  # ... but it makes no step alone (a step ages all else a version)
    trainer.buffer.add(rollouts({f"u{i}": float(i % 2) for i in range(4)}, task="u"))
    picked = trainer._select(1)  # one group per step: the whole group u, and the straggler on top
    assert picked is not None and sorted(picked[1]) == ["d", "u0", "u1", "u2", "u3"]
    data, rows, kept, _ = trainer.data.prepare(picked[0], 1, result)  # type: ignore[misc]
    assert kept == {"d", "u0", "u1", "u2", "u3"}
    trained = dict(
        zip(data.table["rollout_id"].take(rows).to_pylist(), data.advantage_of_row[rows], strict=True)
    )
    assert sorted(trained) == ["d", "u0", "u1", "u2", "u3"]  # a, b and c only lent their rewards
    # against the mean of all four (0, 0, 1, 1): a group of one alone has no advantage at all
    assert trained["d"] == pytest.approx(0.5)
    assert result.rollouts_dropped_constant == 0 and trainer.drops.records == []
    trainer.late.carry(picked[0])
    assert trainer.late.carried == {}  # t is whole now, u was: nothing more to wait for


def test_without_its_groups_earlier_rows_a_rollout_alone_waits(tmp_path: Path) -> None:
    trainer = follower(tmp_path)
    trainer.buffer.add(rollouts({"d": 1.0}))
    assert trainer._select(1) is None


def test_a_late_rollout_with_its_groups_reward_is_dropped_as_constant_not_the_earlier_ones(
    tmp_path: Path,
) -> None:
    trainer = follower(tmp_path)
    result = FollowResult(log_dir=tmp_path, start_step=0)
    trainer.buffer.add(rollouts({"a": 1.0, "b": 1.0}))
    table, _ = trainer._select(0)  # type: ignore[misc]
    assert trainer.data.prepare(table, 0, result) is None  # constant: nothing to train
    trainer.late.carry(table)
    trainer.buffer.add(rollouts({"c": 1.0}))
    trainer.buffer.add(rollouts({f"u{i}": 0.5 for i in range(4)}, task="u"))  # constant too
    late, _ = trainer._select(1)  # type: ignore[misc]
    assert trainer.data.prepare(late, 1, result) is None
    assert result.rollouts_dropped_constant == 7  # a, b at step 0; c, u0-u3 at step 1 (not a, b again)
    assert {r["rollout_id"] for r in trainer.drops.records if r["step"] == 1} == {"c", "u0", "u1", "u2", "u3"}


def test_a_baseline_keeps_keys_and_rewards_but_no_tokens() -> None:
    kept = reward_only(rollouts({"a": 0.25}))
    assert kept["reward"].to_pylist() == [0.25] and kept["task_id"].to_pylist() == ["t"]
    assert kept["tokens"].to_pylist() == [[]] and kept["action_mask"].to_pylist() == [[]]
    assert kept.schema == schemas.trajectories()


def test_correct_mode_keeps_a_spent_rollouts_reward_in_the_baseline_and_drops_it(tmp_path: Path) -> None:
    """Bound 1 at step 3: ``a`` was sampled by version 0, so nothing of it may train; its reward still
    counts in its group's mean (b and c are judged against a, b and c), and it is dropped as stale,
    not sent to the trainer."""
    config = TrainSettings(source=tmp_path, log_dir=tmp_path / "train", groups_per_batch=1)
    options = FollowSettings(group_size=3, max_staleness=1, staleness_mode="correct")
    trainer = FollowTrainer(config, options)
    result = FollowResult(log_dir=tmp_path, start_step=3)
    table = rollouts({"a": 0.0, "b": 1.0, "c": 0.0}, versions={"a": 0, "b": 3, "c": 3})
    prepared = trainer.data.prepare(table, 3, result)
    assert prepared is not None
    data, rows, kept, _ = prepared
    assert kept == {"b", "c"}
    trained = dict(
        zip(data.table["rollout_id"].take(rows).to_pylist(), data.advantage_of_row[rows], strict=True)
    )
    assert trained == pytest.approx({"b": 2 / 3, "c": -1 / 3})  # the mean of a, b and c: 1/3
    assert result.rollouts_dropped_stale == 1 and trainer.drops.since_save == ["a"]
    assert [(r["rollout_id"], r["reason"], r["versions_behind"]) for r in trainer.drops.records] == [
        ("a", "stale", 3)
    ]
