"""The ORS episode agent against a real ORS server and the real sampling endpoint (a scripted
hosted-Tinker double samples the policy's text, so its tool calls are known): tools offered as
structured tools, each tool's reward linked to the call that made it, ``finished`` and the turn limit,
a raising tool failing the rollout; then the environment's reward settings over the built rows."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tinkertrace
from tinkertrace.builder import BuildSettings, build_trajectories
from tinkertrace.evaluation.rollouts import RolloutResult, run_rollouts
from tinkertrace.models.tokenizer import BUILTIN_MODEL, load_tokenizer
from tinkertrace.netutil import BackgroundServer
from tinkertrace.ors.agent import run_episode
from tinkertrace.serving.app import create_app
from tinkertrace.serving.policy import PolicyHolder
from tinkertrace.testing.scripted_sampler import ScriptedTinkerSampler
from tinkertrace.training.config import Environment
from tinkertrace.training.environments import environment_rows

from .conftest import OrsServer

TOKENIZER = load_tokenizer(BUILTIN_MODEL)


def call(tool: str, **arguments: Any) -> str:
    """A tool call as the built-in model's chat template writes it (so each turn extends the last)."""
    return f"<tool_call>\n{json.dumps({'name': tool, 'arguments': arguments})}\n</tool_call>"


def policy(prompt_ids: list[int]) -> str:
    """The scripted policy: reads two clues, then accuses whoever the fingerprints name; answers
    arithmetic in text (never calling submit); calls the faulty environment's raising tool."""
    prompt = TOKENIZER.decode(prompt_ids)
    turn = prompt.count("<|im_start|>assistant") - 1
    if "A murder in the" in prompt:
        if turn < 2:
            return call(["witness", "evidence"][turn])
        return call("accuse", name=re.findall(r"carries (\w+)'s fingerprints", prompt)[-1])
    if "What is" in prompt:
        return "The answer is 4."
    return call("explode")


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    holder = PolicyHolder(ScriptedTinkerSampler(policy), TOKENIZER, "test-model")
    with BackgroundServer(create_app(holder)) as server:
        yield server.url + "/v1"


def episodes(
    spans: Path, endpoint: str, ref: str, env: str, count: int, **kwargs: Any
) -> list[RolloutResult]:
    tinkertrace.init(spans_dir=spans)
    tasks = [{"id": f"{env}/train-{i}/r0", "split": "train", "index": i} for i in range(count)]
    arguments = {"base_url": endpoint, "model": "test-model", "openreward": ref, "max_tokens": 96, **kwargs}
    results = run_rollouts(run_episode, tasks, samples_per_task=1, agent_kwargs=arguments, concurrency=count)
    tinkertrace.flush()
    return results


def test_rewards_land_on_the_calls_that_earned_them(
    ors_server: OrsServer, endpoint: str, tmp_path: Path
) -> None:
    ref = ors_server.url + "/whodunit"
    results = episodes(tmp_path / "spans", endpoint, ref, "whodunit", 2)
    assert [r.error for r in results] == [None, None]
    assert all(r.info["finished"] and r.info["rewards"] == [0.1, 0.1, 1.0] for r in results)
    triplets = build_trajectories(tmp_path / "spans", None, BuildSettings()).triplets
    calls = sorted(tuple(row.values()) for row in triplets.select(["task_id", "turn", "reward"]).to_pylist())
    assert calls == [
        (f"whodunit/train-{i}/r0", turn, r) for i in range(2) for turn, r in enumerate([0.1, 0.1, 1.0])
    ]
    tasks = [r.task_id for r in results]
    for reduction, expected in (("sum", 1.2), ("mean", 0.4), ("last", 1.0)):
        env = Environment(name="whodunit", openreward=ref, reward_reduction=reduction)  # type: ignore[arg-type]
        rows = environment_rows(tmp_path / "spans", env, tasks)
        assert rows.table["reward"].to_pylist() == [pytest.approx(expected)] * 2
        assert rows.table["num_turns"].to_pylist() == [3, 3]  # the whole episode is one sequence


def test_turn_limit_truncates_and_a_raising_tool_fails(
    ors_server: OrsServer, endpoint: str, tmp_path: Path
) -> None:
    spans = tmp_path / "spans"
    cut = episodes(spans, endpoint, ors_server.url + "/arithmetic", "arithmetic", 1, max_turns=2)
    assert cut[0].error is None and cut[0].info == {"finished": False, "turns": 2, "rewards": []}
    failed = episodes(spans, endpoint, ors_server.url + "/faulty", "faulty", 1)
    assert "raised on the server: the tool broke" in (failed[0].error or "")
    arithmetic = Environment(name="arithmetic", openreward="x", nonterminal_reward=-0.5)
    rows = environment_rows(spans, arithmetic, [cut[0].task_id])
    assert rows.stats["truncated"] == 1 and rows.table["reward"].to_pylist() == [-0.5]
    for reduction in ("mean", "sum"):  # without nonterminal_reward, an episode that earned nothing earns 0
        plain = Environment(name="arithmetic", openreward="x", reward_reduction=reduction)  # type: ignore[arg-type]
        assert environment_rows(spans, plain, [cut[0].task_id]).table["reward"].to_pylist() == [0.0]
    faulty = environment_rows(spans, Environment(name="faulty", openreward="x", max_failing_rollouts=0), None)
    assert (faulty.stats["failed"], faulty.stats["groups_dropped_failing"], faulty.table.num_rows) == (
        1,
        1,
        0,
    )


def test_eval_plays_an_openreward_split(ors_server: OrsServer, endpoint: str, tmp_path: Path) -> None:
    from tinkertrace.evaluation.evaluate import evaluate
    from tinkertrace.evaluation.settings import EvalSettings

    settings = EvalSettings(
        agent="tinkertrace.ors.agent:run_episode",
        tasks="tinkertrace.ors.agent:load_tasks",
        openreward=ors_server.url + "/whodunit",
        agent_kwargs={"max_turns": "3", "max_tokens": "96"},
        split="test",
        samples_per_task=1,
        max_tasks=3,
        base_url=endpoint,
        model="test-model",
        out=tmp_path / "eval.jsonl",
    )
    summary = evaluate(settings)
    assert (summary.tasks, summary.failed_rollouts, summary.pass_at_k) == (3, 0, {"pass@1": 1.0})
    assert summary.mean_reward == pytest.approx(1.2)  # two clues and the culprit, on each test case
