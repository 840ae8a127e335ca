"""Multi-environment training over real spans (SDK + real OpenAI client + test server → Parquet):
each environment's reward reduction, nonterminal reward and failing-rollout limit (one DuckDB query),
weight shares of every batch, and group completion in follow mode."""

from __future__ import annotations

import contextlib
import json
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import tinkertrace
from tinkertrace.builder import build_trajectories
from tinkertrace.online.follow import FollowResult, FollowTrainer
from tinkertrace.online.group_staging import GroupStager, select_by_weight
from tinkertrace.online.settings import FollowSettings, make_follow_options
from tinkertrace.online.tail import TailPoll
from tinkertrace.settings import ConfigError
from tinkertrace.training.config import Environment, make_config
from tinkertrace.training.environments import WeightedTurns, environment_rows, epoch_order
from tinkertrace.training.loop import run_training
from tinkertrace.training.metrics import read_metrics

# task id → the step rewards of each of its rollouts ("fail": crashes after its first call;
# "cut": ran out of steps, a `truncated` reward)
ROLLOUTS: dict[str, list[Any]] = {
    "alpha/t1/r0": [[0.1, 0.2, 1.0], [0.1, 0.0, 0.0], [0.3, 0.5, 0.2]],
    "alpha/t2/r0": [[0.5, 0.5, 0.5], "fail"],
    "beta/t1/r0": [[1.0, 0.0], "cut"],
    "beta/t2/r0": [[0.0, 1.0], [0.4, 0.4]],
    "other/x/r0": [[1.0]],
}
REDUCE = {"sum": sum, "mean": statistics.fmean, "max": max, "min": min, "last": lambda r: r[-1]}


@pytest.fixture(scope="module")
def spans(tmp_path_factory: pytest.TempPathFactory, _openai_server_session: Any) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("envs") / "spans"
    client = openai.OpenAI(base_url=_openai_server_session.base_url, api_key="test")
    tinkertrace.init(spans_dir=folder)

    @tinkertrace.traced_rollout
    def episode(task: dict[str, Any]) -> None:
        steps = [0.2, 0.2] if task["plan"] in ("cut", "fail") else task["plan"]
        messages = [{"role": "user", "content": f"task {task['id']}"}]
        for i, reward in enumerate(steps):
            reply = client.chat.completions.create(model="test-model", messages=messages)
            messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""}]
            messages += [{"role": "user", "content": f"go on {i}"}]
            tinkertrace.emit_reward(reward)
            if task["plan"] == "fail":
                raise RuntimeError("the agent crashed")
        if task["plan"] == "cut":
            tinkertrace.emit_reward(1.0, name="truncated")

    try:
        for task_id, plans in ROLLOUTS.items():
            for plan in plans:
                with contextlib.suppress(RuntimeError):
                    episode({"id": task_id, "plan": plan})
        assert tinkertrace.flush()
    finally:
        tinkertrace.shutdown()
    yield folder


def _reward_by_rollout(table: pa.Table) -> list[float]:
    """One reward per rollout (every row of a rollout carries it), sorted."""
    per = table.group_by("rollout_id").aggregate([("reward", "min"), ("reward", "max")])
    assert per["reward_min"].to_pylist() == per["reward_max"].to_pylist()
    return sorted(round(r, 6) for r in per["reward_min"].to_pylist())


@pytest.mark.parametrize("reduction", sorted(REDUCE))
def test_reward_reduction_over_step_rewards(spans: Path, reduction: str) -> None:
    env = Environment(name="alpha", reward_reduction=reduction)  # type: ignore[arg-type]
    got = environment_rows(spans, env, ["alpha/t1/r0"])
    expected = sorted(round(REDUCE[reduction](steps), 6) for steps in ROLLOUTS["alpha/t1/r0"])
    assert _reward_by_rollout(got.table) == expected
    assert got.stats["rollouts"] == 3 and got.stats["failed"] == 0


def test_nonterminal_reward_replaces_a_truncated_rollouts_reward(spans: Path) -> None:
    env = Environment(name="beta", reward_reduction="sum", nonterminal_reward=-0.5)
    got = environment_rows(spans, env, ["beta/t1/r0"])
    assert _reward_by_rollout(got.table) == [-0.5, 1.0]
    assert got.stats["truncated"] == 1
    plain = environment_rows(spans, Environment(name="beta", reward_reduction="sum"), ["beta/t1/r0"])
    assert _reward_by_rollout(plain.table) == [0.4, 1.0]  # without it: the steps' own rewards


@pytest.mark.parametrize(("limit", "groups"), [(None, {"alpha/t1/r0", "alpha/t2/r0"}), (1, None), (0, None)])
def test_max_failing_rollouts_drops_a_group(spans: Path, limit: int | None, groups: set | None) -> None:
    got = environment_rows(spans, Environment(name="alpha", max_failing_rollouts=limit))
    kept = set(got.table["task_id"].to_pylist())
    assert got.stats["rollouts"] == 5 and got.stats["failed"] == 1
    if limit == 0:  # one failed rollout is more than none: its whole group goes
        assert kept == {"alpha/t1/r0"} and got.stats["groups_dropped_failing"] == 1
    else:  # the failed rollout alone is left out
        assert kept == {"alpha/t1/r0", "alpha/t2/r0"} and got.stats["groups_dropped_failing"] == 0
        assert len(set(got.table["rollout_id"].to_pylist())) == 4


def test_weighted_turns_share_every_batch() -> None:
    turns = WeightedTurns([3, 1])
    assert [turns.next() for _ in range(8)] == [0, 0, 1, 0, 0, 0, 1, 0]
    assert WeightedTurns([3, 1]).quotas(4).tolist() == [3, 1]
    group_env = np.array([0] * 9 + [1] * 5)
    order = epoch_order(group_env, [3, 1], seed=0, epoch=0, shuffle=True)
    assert sorted(order.tolist()) == list(range(14))  # every group once
    batches = [group_env[order[i : i + 4]] for i in range(0, 14, 4)]
    assert [int((b == 1).sum()) for b in batches[:3]] == [1, 1, 1]  # 3:1 while both have groups
    assert batches[3].tolist() == [1, 1]  # the rest, once alpha ran out


def test_select_by_weight_waits_for_quotas_then_times_out() -> None:
    waited = np.array([5.0, 4.0, 3.0, 1.0])
    envs = pa.array([0, 0, 0, 1])
    assert select_by_weight(envs, waited, [1, 1], timeout_s=30) == [0, 3]
    assert select_by_weight(envs, waited, [2, 2], timeout_s=30) is None  # beta has one group ready
    assert select_by_weight(envs, waited, [2, 2], timeout_s=5) == [0, 1, 3, 2]  # waited out: fill up


def test_batch_training_shares_steps_by_weight(spans: Path, tmp_path: Path) -> None:
    config = make_config(
        None,
        {
            "source": spans,
            "model": "tinkertrace/tiny-chat:nano",
            "lora_rank": 2,
            "groups_per_batch": 2,
            "seed": 1,  # a plain shuffle of the 4 groups with this seed puts both alpha groups in step 1
            "remove_constant_reward_groups": False,
            "log_dir": tmp_path / "run",
            "engine_dir": tmp_path / "engine",
        },
    )
    config.environments = [
        Environment(name="alpha", reward_reduction="max"),
        Environment(name="beta", nonterminal_reward=-1.0),
    ]
    result = run_training(config, progress=False)
    assert result.steps == 2
    metrics = read_metrics(config.log_dir)
    assert [(m["env/alpha/total_episodes"] > 0, m["env/beta/total_episodes"] > 0) for m in metrics] == [
        (True, True),
        (True, True),
    ]
    stats = json.loads((tmp_path / "run" / "environments.json").read_text())
    assert stats["alpha"]["failed"] == 1 and stats["beta"]["truncated"] == 1
    assert set(stats) == {"alpha", "beta"}  # the other environment's rollout is not trained


def test_follow_holds_groups_until_complete(spans: Path) -> None:
    built = build_trajectories(spans).trajectories
    alpha = built.filter(pc.equal(built["task_id"], "alpha/t1/r0"))
    first_two = pc.unique(alpha["rollout_id"]).to_pylist()[:2]
    stager = GroupStager([Environment(name="alpha", group_size=3)], spans, timeout_s=60)
    stager.stage(alpha.filter(pc.is_in(alpha["rollout_id"], pa.array(first_two))))
    assert stager.release(set()).num_rows == 0  # two of three rollouts: held
    stager.stage(alpha)
    released = stager.release(set())
    assert len(set(released["rollout_id"].to_pylist())) == 3 and stager.arrived == {}
    stager.stage(alpha)  # the same rollouts polled again: never released twice
    assert stager.arrived == {} and stager.release(set()).num_rows == 0
    impatient = GroupStager([Environment(name="alpha", group_size=3)], spans, timeout_s=0)
    impatient.stage(alpha.filter(pc.is_in(alpha["rollout_id"], pa.array(first_two))))
    # waited out: released at two arrived rollouts, built whole from the spans (the third is there)
    assert len(set(impatient.release(set())["rollout_id"].to_pylist())) == 3


def test_follow_trainer_stages_then_shares_by_weight(spans: Path, tmp_path: Path) -> None:
    config = make_config(None, {"source": spans, "log_dir": tmp_path / "run", "groups_per_batch": 2})
    config.environments = [Environment(name="alpha", group_size=3), Environment(name="beta", group_size=2)]
    trainer = FollowTrainer(config, FollowSettings(group_timeout_s=60))
    built = build_trajectories(spans).trajectories
    result = FollowResult(log_dir=tmp_path, start_step=0)
    trainer._collect([TailPoll(built)], result)
    assert set(trainer.stager.arrived) == {"alpha/t2/r0"}  # two of its three rollouts: still held
    assert result.environments["alpha"]["rollouts"] == 3 and result.environments["beta"]["truncated"] == 1
    selected, _ = trainer._select(0)  # type: ignore[misc]
    envs = sorted({t.split("/")[0] for t in selected["task_id"].to_pylist()})
    assert envs == ["alpha", "beta"] and len(set(selected["task_id"].to_pylist())) == 2
    assert "other/x/r0" not in set(trainer.buffer.table["task_id"].to_pylist())


def test_environments_config_file(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text("def play(task, **kw):\n    return 1.0\n")
    path = tmp_path / "multi.yaml"
    path.write_text(
        "groups_per_batch: 4\nfollow: {max_steps: 3, workers: 1}\nenvironments:\n"
        "  - {name: a, agent: agent.py:play, tasks: agent.py:play, weight: 3, reward_reduction: last}\n"
        "  - {name: b, group_size: 2, max_failing_rollouts: 0}\n"
    )
    config = make_config(path)
    a, b = config.environments
    assert a.agent == f"{tmp_path / 'agent.py'}:play" and a.weight == 3.0 and a.reward_reduction == "last"
    assert b.agent is None and b.group_size == 2 and b.max_failing_rollouts == 0
    assert make_follow_options(path, {"workers": 2}).workers == 2  # the command line wins
    assert make_follow_options(path).max_steps == 3
    bad = {
        "  - {name: a, rollouts_per_task: 2}\n": r"unknown environments\[0\] setting 'rollouts_per_task'",
        "  - {name: a, reward_reduction: median}\n": "median",
        "  - {name: a}\n  - {name: a}\n": "listed twice",
        "  - {name: a/b}\n": "no '/'",
        "  - {agent: agent.py:play}\n": r"missing required environments\[0\] setting\(s\): name",
    }
    for entries, message in bad.items():
        path.write_text("environments:\n" + entries)
        with pytest.raises(ConfigError, match=message):
            make_config(path)
