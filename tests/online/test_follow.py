"""Follow mode over a live collector: trains new rollouts, survives SIGKILL without retraining any,
drops stale rollouts and counts them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tinkertrace.online.follow import CORRECT_WITHOUT_SUBSTEPS, FollowTrainer
from tinkertrace.online.lag import rollout_lags
from tinkertrace.online.runner import OnlineStack
from tinkertrace.online.settings import FollowSettings
from tinkertrace.testing.waiting import wait_until
from tinkertrace.training.checkpoints import read_checkpoints
from tinkertrace.training.config import TrainSettings
from tinkertrace.training.metrics import read_metrics
from tinkertrace.training.outcomes import read_outcomes

from .conftest import MODEL, make_rollouts

pytestmark = pytest.mark.slow


def _follow_cmd(stack: OnlineStack, log_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "tinkertrace.cli.main", "train", str(stack.settings.spans_dir), "--follow",
        "--log-dir", str(log_dir), "--model", MODEL, "--engine-dir", str(stack.settings.engine_dir),
        "--group-size", "4", "--groups-per-batch", "1", "--poll-seconds", "0.2", "--no-progress",
        "--max-staleness", "1000", "--learning-rate", "1e-3", "--keep-constant-reward-groups", *extra,
    ]  # fmt: skip


def test_follow_kill_and_restart_trains_each_rollout_once(stack: OnlineStack, tmp_path: Path) -> None:
    log_dir = tmp_path / "follow"
    make_rollouts(stack, "a", groups=3)
    trainer = subprocess.Popen(_follow_cmd(stack, log_dir, "--max-steps", "20"), env={**os.environ})
    try:
        wait_until(lambda: len(read_checkpoints(log_dir)) >= 2, 120)
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(timeout=10)
    finally:
        if trainer.poll() is None:
            trainer.kill()
    before_kill = read_checkpoints(log_dir)
    make_rollouts(stack, "b", groups=2)  # new rollouts arrive while the trainer is down
    done = subprocess.run(
        _follow_cmd(stack, log_dir, "--idle-timeout", "6"), capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    records = read_checkpoints(log_dir)
    assert records[: len(before_kill)] == before_kill
    assert [r["step"] for r in records] == list(range(1, len(records) + 1))
    trained = Counter(rid for r in records for rid in r["trained_rollout_ids"])
    assert trained and max(trained.values()) == 1, "a rollout was trained twice"
    assert len(trained) == 5 * 4  # every complete rollout of both batches, once
    metrics = read_metrics(log_dir)
    assert len(metrics) == len(records)
    assert all(m["lag/rollout_to_trained_p50_s"] > 0 for m in metrics)


def test_stale_rollouts_are_dropped_and_counted(stack: OnlineStack, tmp_path: Path) -> None:
    make_rollouts(stack, "s", groups=2)  # sampled by policy version 0 (nothing publishes here)
    config = TrainSettings(
        source=stack.settings.spans_dir, model=MODEL, groups_per_batch=1, log_dir=tmp_path / "stale",
        engine_dir=stack.settings.engine_dir, learning_rate=1e-3, remove_constant_reward_groups=False,
    )  # fmt: skip
    # max_staleness 0: after the first step (version 1) every version-0 rollout left is too old.
    options = FollowSettings(group_size=4, max_staleness=0, poll_s=0.2, max_steps=3, idle_timeout_s=3)
    result = FollowTrainer(config, options).run(progress=False)
    assert result.steps == 1
    assert result.rollouts_trained == 4
    assert result.rollouts_dropped_stale >= 4  # the other s-group at least
    assert any("stale" in note for note in result.notes)
    (record,) = read_checkpoints(tmp_path / "stale")
    assert record["policy_version"] == 1 and len(record["trained_rollout_ids"]) == 4
    # outcomes.jsonl: the trained rows at step 0, the stale ones dropped at step 1, one version behind
    outcomes = read_outcomes(tmp_path / "stale")
    trained = {o["rollout_id"] for o in outcomes if o["outcome"] == "trained"}
    assert trained == set(record["trained_rollout_ids"])
    assert {o["step"] for o in outcomes if o["outcome"] == "trained"} == {0}
    stale = [o for o in outcomes if o["outcome"] == "dropped"]
    assert len({o["rollout_id"] for o in stale}) == result.rollouts_dropped_stale
    assert {(o["reason"], o["step"], o["versions_behind"]) for o in stale} == {("stale", 1, 1)}


def test_rows_of_consumed_rollouts_are_never_buffered_again(tmp_path: Path) -> None:
    """A subclass that rebuilds a whole group (as the examples do) cannot bring back rollouts that
    were trained or dropped before, in this run or a recorded one."""
    import pyarrow as pa

    trainer = FollowTrainer(TrainSettings(source=tmp_path, log_dir=tmp_path / "train"), FollowSettings())
    trainer.buffer.consumed |= {"trained-before", "dropped-before"}
    rebuilt = pa.table(
        {"rollout_id": ["trained-before", "new", "dropped-before", "new"], "turn": [0, 0, 0, 1]}
    )
    trainer.buffer.add(rebuilt)
    assert trainer.buffer.table["rollout_id"].to_pylist() == ["new", "new"]


def test_a_rollout_whose_agents_train_in_different_steps_keeps_its_arrival_time(tmp_path: Path) -> None:
    """Grouped by task+agent, a rollout's solver rows may train a step before its judge rows: the judge
    rows still waiting keep the rollout's arrival time (a resumed solver_judge run failed on this)."""
    import pyarrow as pa

    config = TrainSettings(
        source=tmp_path, log_dir=tmp_path / "train", group_by="task+agent", groups_per_batch=1
    )
    trainer = FollowTrainer(config, FollowSettings(group_size=2, max_staleness=None))
    rows = pa.table(
        {
            "rollout_id": ["r1", "r1", "r2", "r2"],
            "task_id": ["t"] * 4,
            "agent_name": ["solver", "judge", "solver", "judge"],
            "end_time": pa.array([1_000_000_000] * 4, pa.timestamp("ns", tz="UTC")),
        }
    )
    trainer.buffer.add(rows)
    first = trainer._select(0)
    assert first is not None
    table, ids = first
    assert sorted(ids) == ["r1", "r2"] and len(set(table["agent_name"].to_pylist())) == 1  # one agent's group
    rollout_lags(table, set(ids), trainer.buffer.arrived, step_started=2.0)
    trainer.buffer.consume(ids)
    second = trainer._select(0)  # the other agent's group: before the fix, a KeyError on its arrival time
    assert second is not None and sorted(second[1]) == ["r1", "r2"]
    trainer.buffer.consume(second[1])
    assert trainer.buffer.arrived == {}  # nothing left waiting: every arrival time is gone


def test_correct_mode_trains_stale_groups_within_the_bound_and_drops_whole_groups_beyond(
    stack: OnlineStack, tmp_path: Path
) -> None:
    """Groups sampled by version 0, one trained per step, bound 1: the second step trains a group one
    version old with the correction (its tokens' weights from one forward pass on the moved trainer,
    a positive mismatch KL); after it the rest, two versions old, are dropped. Each group's rewards
    differ and constant-reward groups (earlier tests' rollouts in the same spans folder can be) are
    not trained, so every step moves the trainer."""
    make_rollouts(stack, "c", groups=3, rewards=[0.0, 0.3, 0.6, 1.0])
    config = TrainSettings(
        source=stack.settings.spans_dir, model=MODEL, groups_per_batch=1, log_dir=tmp_path / "correct",
        engine_dir=stack.settings.engine_dir, learning_rate=3e-2, loss="ppo",
    )  # fmt: skip
    options = FollowSettings(
        group_size=4, max_staleness=1, staleness_mode="correct", poll_s=0.2, max_steps=3, idle_timeout_s=3
    )
    result = FollowTrainer(config, options).run(progress=False)
    assert (result.steps, result.rollouts_trained) == (2, 8)
    assert result.rollouts_dropped_stale >= 4  # the third c-group at least (earlier tests' rollouts too)
    first, second = read_metrics(tmp_path / "correct")
    for step, metrics in enumerate((first, second)):
        tokens = metrics["env/all/total_ac_tokens"]
        assert metrics[f"offpolicy/token_age_{step}"] == tokens  # every trained token `step` versions old
        assert metrics[f"offpolicy/rollout_age_{step}"] == 4
        assert metrics["offpolicy/truncated_frac"] >= 0 and "offpolicy/straggler_wait_s" in metrics
    assert abs(first["offpolicy/mismatch_kl"]) < 1e-4  # sampled by the trainer's own weights
    assert second["offpolicy/mismatch_kl"] > 1e-4  # the trainer moved one step since
    # by token age: step 0's tokens are all age 0, step 1's all age 1 (one update's drift)
    assert first["offpolicy/mismatch_kl_age_0"] == first["offpolicy/mismatch_kl"]
    assert second["offpolicy/mismatch_kl_age_1"] == pytest.approx(second["offpolicy/mismatch_kl"])
    assert "offpolicy/mismatch_kl_age_0" not in second
    assert second["offpolicy/clipped_frac"] == 0  # clipped against the proximal policy: ratio 1 at the start
    assert CORRECT_WITHOUT_SUBSTEPS in result.notes  # so the user is told the clip never acted
    dropped = [o for o in read_outcomes(tmp_path / "correct") if o["outcome"] == "dropped"]
    stale = [o for o in dropped if o["reason"] == "stale"]  # the rest: constant-reward groups
    assert len({o["rollout_id"] for o in stale}) == result.rollouts_dropped_stale
    assert {(o["reason"], o["step"], o["versions_behind"]) for o in stale} == {("stale", 2, 2)}
