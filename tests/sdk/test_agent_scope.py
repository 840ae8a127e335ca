"""Agent spans shared by concurrent tasks and threads: every LLM and reward span is scoped to the
agent span it ran in (parent span, agent name and ``tinkertrace.agent.span_id``)."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

import tinkertrace
from tinkertrace import semconv

ROLLOUTS, TASKS = 4, 6


def _check_scopes(traced) -> None:
    """Each agent span holds exactly one LLM call and one reward, both of its own task number."""
    agents = {r["span_id"]: r for r in traced.rows("span_type = 'agent'")}
    assert len(agents) == ROLLOUTS * TASKS
    inside: dict[str, list[dict]] = {span_id: [] for span_id in agents}
    for row in traced.rows("span_type in ('llm', 'reward')"):
        agent = agents[row["parent_span_id"]]
        assert row["agent_name"] == agent["agent_name"] and row["rollout_id"] == agent["rollout_id"]
        assert json.loads(row["attributes"])[semconv.AGENT_SPAN_ID] == agent["span_id"]
        inside[agent["span_id"]].append(row)
    for rows in inside.values():
        llm, reward = sorted(rows, key=lambda r: r["span_type"])
        asked = json.loads(json.loads(llm["attributes"])[semconv.GENAI_INPUT_MESSAGES])[0]["content"]
        assert asked == f"task {int(reward['reward_value'])}"


def test_one_agent_span_object_in_concurrent_asyncio_tasks(openai_server, traced) -> None:
    judge, solver = tinkertrace.agent_span("judge"), tinkertrace.agent_span("solver")
    client = openai.AsyncOpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0)

    async def work(i: int) -> None:
        async with judge if i % 2 else solver:
            messages = [{"role": "user", "content": f"task {i}"}]
            await client.chat.completions.create(model="m", messages=messages)
            await asyncio.sleep(0.001 * (TASKS - i))  # exits in another order than entries
            tinkertrace.emit_reward(float(i))

    @tinkertrace.traced_rollout
    async def rollout(task: int) -> None:
        await asyncio.gather(*(work(i) for i in range(TASKS)))

    async def main() -> None:
        await asyncio.gather(*(rollout(r) for r in range(ROLLOUTS)))

    asyncio.run(main())
    _check_scopes(traced)


def test_one_agent_span_object_in_threads(openai_server, traced) -> None:
    judge = tinkertrace.agent_span("judge")

    def work(i: int) -> None:
        with judge:
            body = {"model": "m", "messages": [{"role": "user", "content": f"task {i}"}]}
            httpx.post(openai_server.base_url + "/chat/completions", json=body)
            tinkertrace.emit_reward(float(i))

    @tinkertrace.traced_rollout
    def rollout(task: int) -> None:
        with ThreadPoolExecutor(TASKS) as pool:
            list(pool.map(work, range(TASKS)))

    with ThreadPoolExecutor(ROLLOUTS) as pool:
        list(pool.map(rollout, range(ROLLOUTS)))
    _check_scopes(traced)


def test_exit_without_entry_in_this_context_warns(traced) -> None:
    scope = tinkertrace.agent_span("judge")
    with pytest.warns(RuntimeWarning, match="did not enter it"):
        scope.__exit__(None, None, None)
