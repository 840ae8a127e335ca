"""Rewards of concurrent agents: 100 rollouts at once, each with a solver and a judge working
concurrently in their own ``agent_span`` and emitting rewards while the other agent is calling.
Real SDK, real OpenAI client, the embedded Parquet sink, real DuckDB."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import openai
import pytest

import tinkertrace
from tinkertrace.builder import BuildSettings, build_trajectories

ROLLOUTS = 100
TURNS = 2
# each agent's rewards carry its own value, so a misattributed reward shows on the triplet
VALUES = {"solver": 1.0, "judge": 0.25}


async def _agent(client: openai.AsyncOpenAI, name: str, task: str, rng: random.Random) -> None:
    with tinkertrace.agent_span(name):
        for turn in range(TURNS):
            await asyncio.sleep(rng.random() * 0.004)
            await client.chat.completions.create(
                model="test-model", messages=[{"role": "user", "content": f"{name} {task} {turn}"}]
            )
            await asyncio.sleep(rng.random() * 0.004)  # the other agent may call meanwhile
            tinkertrace.emit_reward(VALUES[name])


@pytest.mark.slow
def test_concurrent_agents_get_their_own_rewards(tmp_path: Path, openai_server: Any) -> None:
    spans = tmp_path / "spans"
    openai_server.options.latency_s = 0.002
    tinkertrace.init(spans_dir=spans)
    try:
        client = openai.AsyncOpenAI(base_url=openai_server.base_url, api_key="test")

        @tinkertrace.traced_rollout
        async def solve(task: dict[str, Any]) -> None:
            rng = random.Random(task["id"])
            await asyncio.gather(*(_agent(client, name, task["id"], rng) for name in VALUES))

        async def main() -> None:
            await asyncio.gather(*(solve({"id": f"t{i:03d}"}) for i in range(ROLLOUTS)))
            await client.close()

        asyncio.run(main())
        tinkertrace.flush()
    finally:
        tinkertrace.shutdown()
    for policy in ("nearest", "link"):
        result = build_trajectories(spans, None, BuildSettings(reward_policy=policy, group_by="task+agent"))
        s = result.summary
        calls = ROLLOUTS * len(VALUES) * TURNS
        assert (s.rollouts_built, s.triplets, s.rewards) == (ROLLOUTS, calls, calls)
        assert (s.rewards_matched, s.rewards_unmatched) == (s.rewards, 0)
        trips = result.triplets.to_pylist()
        wrong = [t for t in trips if t["reward"] != VALUES[t["agent_name"]]]
        assert wrong == [], f"{len(wrong)} calls got another agent's reward under {policy}"
        expected = {name: TURNS * value for name, value in VALUES.items()}
        rows = result.trajectories.select(["agent_name", "reward"]).to_pylist()
        assert {(r["agent_name"], r["reward"]) for r in rows} == set(expected.items())
