"""Loud when nothing trains: the watch's counts and clock, batch mode's error naming the rewards and
the share of replies cut, and the per-step cut-share metric, on span folders built for real."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow.compute as pc
import pytest

from tests.training.span_groups import write_groups
from tinkertrace.builder import build_trajectories
from tinkertrace.training.config import TrainSettings
from tinkertrace.training.errors import DataError
from tinkertrace.training.loop import run_training
from tinkertrace.training.metrics import read_metrics
from tinkertrace.training.trainability import GroupTally, TrainabilityWatch, WatchLimits

MODEL = "tinkertrace/tiny-chat:nano"


def constant_tally(groups: int, reward: float = 0.0) -> GroupTally:
    return GroupTally(
        groups=groups, reasons=Counter(constant_reward=groups), rewards=Counter({reward: groups})
    )


def test_the_watch_warns_after_its_count_again_after_its_period_and_gives_up_at_its_limit() -> None:
    now = [0.0]
    limits = WatchLimits(warn_groups=3, warn_s=60, repeat_s=300, give_up_groups=10, give_up_s=None)
    watch = TrainabilityWatch(limits, clock=lambda: now[0])
    watch.observe(constant_tally(2))
    assert watch.check() is None  # two groups, seconds in: not yet
    watch.observe(constant_tally(1))
    first = watch.check()
    assert first is not None and not first.give_up
    assert first.message.startswith(
        "no group could be trained: all 3 groups in 0 s: 3 with a constant reward"
    )
    assert "every reward 0" in first.message and "--keep-constant-reward-groups" in first.message
    watch.observe(constant_tally(1))
    now[0] = 299
    assert watch.check() is None  # said already: again only after repeat_s
    now[0] = 301
    again = watch.check()
    assert again is not None and "all 4 groups in 301 s" in again.message
    watch.observe(constant_tally(6, reward=1.0))
    stop = watch.check()
    assert stop is not None and stop.give_up
    assert "one reward per group: 1 in 6, 0 in 4" in stop.message


def test_a_trainable_group_ends_the_streak_and_time_alone_warns() -> None:
    now = [0.0]
    watch = TrainabilityWatch(WatchLimits(warn_groups=5, warn_s=60, repeat_s=300), clock=lambda: now[0])
    watch.observe(constant_tally(4))
    watch.observe(GroupTally(groups=2, trainable=1, reasons=Counter(constant_reward=1)))
    now[0] = 100
    assert watch.check() is None  # a group trained: nothing to say
    watch.observe(GroupTally(groups=1, reasons=Counter(failed=1)))
    now[0] = 159
    assert watch.check() is None
    now[0] = 160  # one group, but a minute without a trainable one
    alert = watch.check()
    assert alert is not None and "all 1 groups in 60 s: 1 with no reward" in alert.message
    assert "the agents' errors" in alert.message and not alert.give_up


def test_batch_training_on_constant_groups_names_the_rewards_and_the_replies_cut(tmp_path: Path) -> None:
    """Today's message named neither: "all 2 groups have a constant reward ..."."""
    spans = tmp_path / "spans"
    write_groups(spans, {"a": [0.0] * 4, "b": [0.0] * 4}, cut=[[True], [True], [True], [False]])
    config = TrainSettings(source=spans, model=MODEL, backend="local", log_dir=tmp_path / "run")
    with pytest.raises(DataError) as raised:
        run_training(config, progress=False)
    message = str(raised.value)
    assert "all 2 groups: 2 with a constant reward (every reward 0)" in message
    assert "75% of their replies cut by the reply cap (high)" in message
    assert "a larger reply budget (max_tokens)" in message and "--keep-constant-reward-groups" in message
    assert "more rollouts per group" in message and "partial credit" in message


def test_each_step_logs_the_share_of_its_replies_cut_by_the_reply_cap(tmp_path: Path) -> None:
    """Multi-turn rollouts, some turns cut: each trajectory row counts its cut replies, and the step's
    ``env/all/replies/cut_share`` is the share of truncated calls among its rows' calls."""
    spans = tmp_path / "spans"
    cut = [[True, False, True], [False, False], [True], [False, True]]
    write_groups(spans, {"m": [0.0, 1.0, 0.0, 1.0]}, cut=cut)
    built = build_trajectories(spans)
    truncated = built.triplets["truncated"].to_pylist()
    assert sum(truncated) == 4 and len(truncated) == 8
    assert built.trajectories["num_turns"].to_pylist() == [3, 2, 1, 2]
    assert built.trajectories["replies_cut"].to_pylist() == [2, 0, 1, 1]
    config = TrainSettings(
        source=spans, model=MODEL, backend="local", log_dir=tmp_path / "run", groups_per_batch=1, lora_rank=4
    )
    run_training(config, progress=False)
    (step,) = read_metrics(config.log_dir)
    assert step["env/all/replies/cut_share"] == pytest.approx(sum(truncated) / len(truncated))
    assert pc.sum(built.trajectories["replies_cut"]).as_py() == 4


def test_the_time_limit_gives_up_only_once_the_warning_count_was_seen() -> None:
    """One slow untrainable group is no reason to end a run: past give_up_s it warns; once
    warn_groups groups were seen it gives up."""
    now = [0.0]
    limits = WatchLimits(warn_groups=3, warn_s=60, repeat_s=300, give_up_groups=None, give_up_s=100)
    watch = TrainabilityWatch(limits, clock=lambda: now[0])
    watch.observe(constant_tally(1))
    now[0] = 200
    alert = watch.check()
    assert alert is not None and not alert.give_up
    watch.observe(constant_tally(2))
    stop = watch.check()
    assert stop is not None and stop.give_up and "all 3 groups in 200 s" in stop.message
