"""Each example agent against the deterministic OpenAI test server: the trajectories it leaves behind
(turn counts, agent names, rewards), built from its spans by the real builder."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

import tinkertrace
from tinkertrace.builder import BuildSettings, build_trajectories
from tinkertrace.evaluation.rollouts import RolloutResult, load_ref, run_rollouts
from tinkertrace.models.tokenizer import BUILTIN_MODEL, load_tokenizer
from tinkertrace.netutil import BackgroundServer
from tinkertrace.serving.app import create_app
from tinkertrace.serving.policy import PolicyHolder
from tinkertrace.testing.openai_server import ReplyRequest
from tinkertrace.testing.scripted_sampler import ScriptedTinkerSampler
from tinkertrace.training.config import make_config
from tinkertrace.training.environments import environment_rows

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(
    tmp_path: Path,
    server: Any,
    agent_ref: str,
    tasks: list[dict],
    responder: Any,
    samples: int = 1,
    **kwargs: Any,
) -> tuple[Path, list[RolloutResult]]:
    spans = tmp_path / "spans"
    tinkertrace.init(spans_dir=spans)
    server.options.responder = responder
    agent = load_ref(f"{EXAMPLES / agent_ref}")
    results = run_rollouts(
        agent,
        tasks,
        samples_per_task=samples,
        agent_kwargs={"base_url": server.base_url, "model": "test-model", **kwargs},
        concurrency=2,
    )
    tinkertrace.flush()
    return spans, results


def _rows(table: pa.Table) -> list[dict]:
    return sorted(
        table.drop_columns(["end_time"]).to_pylist(),
        key=lambda r: (r["task_id"], r["agent_name"] or "", r["rollout_id"]),
    )


def test_hello_rewards_partial_credit(openai_server, tmp_path: Path) -> None:
    replies = iter(["I am Tinker.", "I am", "\x00\xff garbage"])
    spans, results = _run(
        tmp_path,
        openai_server,
        "hello/agent.py:introduce",
        [{"id": "h1", "question": "Who are you?"}],
        lambda _req: next(replies),
        samples=3,
    )
    assert sorted(r.reward for r in results)[-1] == 1.0
    assert all(r.error is None for r in results)
    traj = build_trajectories(spans).trajectories
    assert traj.num_rows == 3 and set(traj["num_turns"].to_pylist()) == {1}
    rewards = sorted(traj["reward"].to_pylist())
    assert rewards[-1] == 1.0 and 0.0 < rewards[1] < 1.0  # "I am" gets prefix credit


def test_guess_number_turns_merge_into_one_trajectory(openai_server, tmp_path: Path) -> None:
    guesses = {"g-found": iter(["5", "abc", "7"]), "g-missed": iter(["1", "2", "3"])}

    def respond(req: ReplyRequest) -> str:
        secret_task = "g-found" if "from 1 to 8" in req.messages[1]["content"] else "g-missed"
        return next(guesses[secret_task])

    tasks = [
        {"id": "g-found", "low": 1, "high": 8, "secret": 7},
        {"id": "g-missed", "low": 1, "high": 16, "secret": 12},
    ]
    spans, results = _run(tmp_path, openai_server, "guess_number/agent.py:play", tasks, respond, max_turns=3)
    by_task = {r.task_id: r for r in results}
    assert by_task["g-found"].reward == 1.0 and by_task["g-found"].info["guesses"] == [5, None, 7]
    assert 0.0 < by_task["g-missed"].reward < 1.0
    feedback = [m["content"] for m in openai_server.requests[-1]["messages"] if m["role"] == "user"]
    assert any("too" in f for f in feedback)
    traj = _rows(build_trajectories(spans).trajectories)
    assert [(r["task_id"], r["num_turns"]) for r in traj] == [("g-found", 3), ("g-missed", 3)]
    assert traj[0]["reward"] == 1.0
    mask = traj[0]["action_mask"]
    assert 0 < sum(mask) < len(mask)  # feedback tokens are in the sequence but not trained


def test_twenty_questions_player_only_with_search_tool(openai_server, tmp_path: Path) -> None:
    def respond(req: ReplyRequest) -> str:
        system = req.messages[0]["content"]
        if "secret" in system:
            return "no"
        asked = sum(m["role"] == "assistant" for m in req.messages)
        if asked == 0:
            return '<tool_call>{"name": "search", "arguments": {"query": "animal"}}</tool_call>'
        return "Is it a fish?" if asked == 1 else "Is it a cat?"

    task = {"id": "20q-cat", "category": "animal", "answer": "cat"}
    spans, results = _run(
        tmp_path,
        openai_server,
        "twenty_questions/agent.py:play",
        [task],
        respond,
        max_questions=4,
        max_tokens=128,
    )
    assert results[0].reward == 1.0 and results[0].info == {"found": True, "questions": 2}
    tool_result = [
        m["content"] for r in openai_server.requests for m in r["messages"] if "Results:" in m["content"]
    ]
    assert tool_result and "cat" in tool_result[0] and "dog" in tool_result[0]
    everything = build_trajectories(spans, options=BuildSettings(group_by="task+agent", reward_policy="link"))
    assert set(everything.triplets["agent_name"].to_pylist()) == {"player", "answerer"}
    player = build_trajectories(
        spans, options=BuildSettings(agent="^player$", group_by="task+agent", reward_policy="link")
    ).trajectories
    assert set(player["agent_name"].to_pylist()) == {"player"}
    assert player["group_key"].to_pylist()[0] == "20q-cat::player"
    assert sum(player["num_turns"].to_pylist()) == 3  # search call, the fish question, the cat question
    assert max(player["reward"].to_pylist()) == 1.0


def test_solver_judge_rewards_per_agent(openai_server, tmp_path: Path) -> None:
    answers = iter(["2 + 3 + 4", "junk )(", "2 * 3"])

    def respond(req: ReplyRequest) -> str:
        text = req.messages[0]["content"]
        if "Candidate answers" in text:
            return str(
                1 + [line.endswith("2 + 3 + 4") for line in re.findall(r"^\d\. .*$", text, re.M)].index(True)
            )
        return next(answers)

    task = {"id": "cd-0", "numbers": [2, 3, 4], "target": 9}
    spans, results = _run(
        tmp_path, openai_server, "solver_judge/agent.py:solve", [task], respond, num_solvers=3
    )
    assert results[0].reward == 1.0 and sorted(results[0].info["solver_rewards"])[-1] == 1.0
    (env,) = make_config(EXAMPLES / "solver_judge/config.yaml").environments
    built = environment_rows(spans, env, ["cd-0"])
    assert built.stats["rollouts"] == 1 and built.stats["failed"] == 0
    rows = _rows(built.table)
    assert [r["agent_name"] for r in rows] == ["judge", "solver", "solver", "solver"]
    assert {r["group_key"] for r in rows} == {"cd-0::judge", "cd-0::solver"}
    assert rows[0]["reward"] == 1.0
    assert sorted(r["reward"] for r in rows[1:]) == sorted(results[0].info["solver_rewards"])


def test_multi_env_reward_settings_per_environment(tmp_path: Path) -> None:
    """Against the real sampling endpoint (scripted hosted-Tinker double): the agent reads only the
    structured ``tool_calls`` the endpoint parsed from the sampled ``<tool_call>`` text. The calls are
    written as the chat template renders them, so each turn's prompt extends the last one."""
    tokenizer = load_tokenizer(BUILTIN_MODEL)

    def respond(prompt_ids: list[int]) -> str:
        prompt = tokenizer.decode(prompt_ids)
        if "backwards" in prompt:  # spelling: one good tool call, then a near miss
            asked = prompt.count("<|im_start|>assistant") - 1
            return (
                '<tool_call>\n{"name": "letters", "arguments": {"word": "apple"}}\n</tool_call>'
                if asked == 0
                else "elpp"
            )
        return '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1 + 2"}}\n</tool_call>'

    policy = PolicyHolder(ScriptedTinkerSampler(respond), tokenizer, "test-model")
    endpoint = BackgroundServer(create_app(policy)).start()
    endpoint.options = SimpleNamespace(responder=None)
    endpoint.base_url = endpoint.url + "/v1"
    tasks = [
        {"id": "arithmetic/a1/r0", "env": "arithmetic", "expression": "1 + 2"},
        {"id": "spelling/s1/r0", "env": "spelling", "word": "apple"},
    ]
    try:
        spans, results = _run(
            tmp_path, endpoint, "multi_env/agent.py:run_episode", tasks, None, max_steps=2, max_tokens=128
        )
    finally:
        endpoint.stop()
    by_task = {r.task_id: r for r in results}
    assert by_task["arithmetic/a1/r0"].info["terminal"] is False  # only tool calls: truncated
    assert by_task["spelling/s1/r0"].info["step_rewards"][0] == 0.1
    envs = {e.name: e for e in make_config(EXAMPLES / "multi_env" / "config.yaml").environments}
    arith = environment_rows(spans, envs["arithmetic"], ["arithmetic/a1/r0"])
    assert arith.stats["truncated"] == 1 and arith.table["reward"].to_pylist() == [-0.2]  # nonterminal_reward
    spell = environment_rows(spans, envs["spelling"], ["spelling/s1/r0"])
    final = by_task["spelling/s1/r0"].reward
    assert spell.stats["truncated"] == 0 and 0.1 < final < 1.0
    assert spell.table["reward"].to_pylist() == [pytest.approx(max(0.1, final))]  # reward_reduction: max
    assert spell.table["num_turns"].to_pylist() == [2]


@pytest.mark.parametrize("garbage", ["", "}{ <tool_call>not json</tool_call>", "\ufffd\x00 9/0 ((("])
def test_agents_survive_garbage_output(openai_server, tmp_path: Path, garbage: str) -> None:
    refs = {
        "hello/agent.py:introduce": {"id": "x", "question": "?"},
        "guess_number/agent.py:play": {"id": "x", "low": 1, "high": 4, "secret": 2},
        "twenty_questions/agent.py:play": {"id": "x", "category": "fruit", "answer": "apple"},
        "solver_judge/agent.py:solve": {"id": "x", "numbers": [1, 2], "target": 3},
        "multi_env/agent.py:run_episode": {"id": "x", "env": "arithmetic", "expression": "1 + 2"},
    }
    for ref, task in refs.items():
        _, results = _run(tmp_path / ref.split("/")[0], openai_server, ref, [task], lambda _r: garbage)
        assert results[0].error is None, (ref, results[0].error)
        assert results[0].reward is not None and 0.0 <= results[0].reward < 1.0
