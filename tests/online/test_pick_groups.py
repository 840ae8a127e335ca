"""Which groups a follow step takes: the ones nearest the staleness bound first, and a group that
would go stale at the next step with the rollouts it has, so only its stragglers are lost."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa

from tinkertrace.online.follow import FollowTrainer
from tinkertrace.online.settings import FollowSettings
from tinkertrace.training.config import TrainSettings


def groups(spec: dict[str, tuple[int, int]]) -> pa.Table:
    """Per task: (rollouts, the policy version that sampled them); one row of one token each."""
    tasks = [(task, i, version) for task, (n, version) in spec.items() for i in range(n)]
    return pa.table(
        {
            "rollout_id": [f"{task}-{i}" for task, i, _ in tasks],
            "task_id": [task for task, _, _ in tasks],
            "agent_name": pa.nulls(len(tasks), pa.string()),
            "segment": pa.array([0] * len(tasks), pa.int32()),
            "action_mask": pa.array([[0, 1]] * len(tasks), pa.list_(pa.int8())),
            "policy_version": pa.array([version for *_, version in tasks], pa.int64()),
        }
    )


def trainer(tmp_path: Path, mode: str = "drop") -> FollowTrainer:
    config = TrainSettings(source=tmp_path, log_dir=tmp_path / "train", groups_per_batch=2)
    options = FollowSettings(group_size=4, group_timeout_s=60, max_staleness=1, staleness_mode=mode)
    return FollowTrainer(config, options)


def test_a_step_takes_the_groups_nearest_the_bound_first(tmp_path: Path) -> None:
    """At step 4 with bound 1: two whole groups of version 4 waited longest, a whole group of version
    3 arrived last; the version-3 group goes now (before, it waited behind the younger ones and was
    dropped at step 5)."""
    follow = trainer(tmp_path)
    follow.buffer.add(groups({"young-a": (4, 4), "young-b": (4, 4), "old": (4, 3)}))
    follow.buffer.arrived.update({f"young-{g}-{i}": time.time() - 5 for g in "ab" for i in range(4)})
    picked = follow._select(4)
    assert picked is not None
    assert sorted(set(picked[0]["task_id"].to_pylist())) == ["old", "young-a"]
    # what is left is one version old at the next step: trained
    assert follow.drops.drop_stale(follow.buffer, 5) == []


def test_a_group_due_now_trains_without_its_straggler(tmp_path: Path) -> None:
    """The version-3 group has three of its four rollouts (the fourth is a long episode still
    running): at step 4 it is due, so it trains with three rather than go stale whole at step 5."""
    for mode in ("drop", "correct"):
        follow = trainer(tmp_path / mode, mode)
        follow.buffer.add(groups({"young-a": (4, 4), "young-b": (4, 4), "old": (3, 3)}))
        picked = follow._select(4)
        assert picked is not None
        assert sorted(picked[1]) == ["old-0", "old-1", "old-2", *(f"young-a-{i}" for i in range(4))]
        assert follow.drops.drop_stale(follow.buffer, 5) == []
        follow.buffer.add(groups({"old": (1, 3)}).set_column(0, "rollout_id", pa.array(["old-3"])))
        # the straggler alone: it finished too late
        assert follow.drops.drop_stale(follow.buffer, 5) == ["old-3"]


def test_waiting_groups_do_not_start_a_step_early(tmp_path: Path) -> None:
    """A due group that is not whole does not make a step run: the trainer still waits for a
    batch (no version goes by while it waits, so nothing goes stale meanwhile)."""
    follow = trainer(tmp_path)
    follow.buffer.add(groups({"young-a": (4, 4), "old": (3, 3)}))
    assert follow._select(4) is None
