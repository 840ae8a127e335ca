"""Agent names from enclosing agent spans, and which calls can take a reward, in our span form and
in other producers' (Agent-lightning, the GenAI ``invoke_agent`` convention)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tinkertrace import semconv as sc
from tinkertrace.builder import BuildSettings, build_trajectories

from .conftest import SpanRows

FORMS = ("ours", "genai", "agentlightning")
AGL_RESOURCE = {sc.AGL_ROLLOUT_ID: "r1", sc.AGL_ATTEMPT_ID: "0"}


def build(folder: Path, **opts: Any) -> Any:
    return build_trajectories(folder, None, BuildSettings(**opts))


class Rollout:
    """One rollout ``r1`` written in one producer's span form."""

    def __init__(self, rows: SpanRows, form: str) -> None:
        self.rows, self.form = rows, form
        self.root = None if form == "agentlightning" else rows.rollout("r1")

    def _common(self) -> dict[str, Any]:
        if self.form == "agentlightning":
            return {"resource": AGL_RESOURCE}
        return {"rollout_id": "r1", "task_id": "t1"}

    def agent(self, name: str, parent: str | None, start: float, end: float) -> str:
        """An agent span named ``name`` as the form writes it (the name on the agent span only)."""
        parent = parent or self.root
        if self.form == "agentlightning":
            attrs = {sc.FOREIGN_AGENT_NAME: name}
            return self.rows.span(trace="r1", name="agent", start=start, end=end, parent=parent,
                                  attributes=attrs, **self._common())  # fmt: skip
        if self.form == "genai":
            attrs = {sc.GENAI_OPERATION: sc.AGENT_OPERATION}
            return self.rows.span(trace="r1", name=f"invoke_agent {name}", start=start, end=end,
                                  parent=parent, attributes=attrs, **self._common())  # fmt: skip
        return self.rows.span(trace="r1", name=f"invoke_agent {name}", start=start, end=end, parent=parent,
                              span_type=sc.TYPE_AGENT, agent_name=name, **self._common())  # fmt: skip

    def step(self, parent: str, start: float, end: float) -> str:
        """A plain span between an agent span and its calls (a tool, a chain step)."""
        return self.rows.span(trace="r1", name="step", start=start, end=end, parent=parent, **self._common())

    def call(self, parent: str | None, prompt: Any, response: Any, start: float, **kw: Any) -> str:
        """An LLM call naming no agent; ``[]`` ids are written as the form writes empty arrays."""
        parent = parent or self.root
        if self.form == "agentlightning":
            attrs = {sc.AGL_PROMPT_TOKEN_IDS: prompt, sc.AGL_RESPONSE_TOKEN_IDS: response}
            return self.rows.span(trace="r1", name="openai.chat.completion", start=start, end=start + 1,
                                  parent=parent, attributes=attrs, **self._common())  # fmt: skip
        return self.rows.llm("r1", parent, prompt, response, start=start, end=start + 1, **kw)

    def reward(self, parent: str | None, value: float, at: float) -> str:
        parent = parent or self.root
        if self.form == "agentlightning":
            return self.rows.span(trace="r1", name=sc.AGL_REWARD_SPAN, start=at, end=at, parent=parent,
                                  attributes={"reward": value}, **self._common())  # fmt: skip
        return self.rows.reward("r1", parent, value, at=at)


@pytest.mark.parametrize("form", FORMS)
def test_call_agent_is_the_enclosing_agent_spans(tmp_path: Path, rows: SpanRows, form: str) -> None:
    r = Rollout(rows, form)
    solver = r.agent("solver", None, 1, 50)
    r.call(r.step(solver, 2, 10), [1, 2], [3], 3)  # two levels below its agent span
    judge = r.agent("judge", solver, 20, 40)  # nested: the innermost agent span names the call
    r.call(judge, [1, 2, 3, 9], [4], 21)
    r.call(solver, [1, 2, 3], [5], 45)
    r.call(None, [7], [8], 60)  # outside any agent span
    rows.write(tmp_path)
    result = build(tmp_path, group_by="task+agent")
    trips = result.triplets.to_pylist()
    assert sorted((t["turn"], t["agent_name"]) for t in trips) == [
        (0, "solver"), (1, "judge"), (2, "solver"), (3, None)
    ]  # fmt: skip
    by_group = {row["group_key"]: row["num_turns"] for row in result.trajectories.to_pylist()}
    task = "t1" if form != "agentlightning" else "r1"
    assert by_group == {f"{task}::solver": 2, f"{task}::judge": 1, f"{task}::": 1}
    judged = build(tmp_path, agent="^judge$")
    assert judged.triplets.column("turn").to_pylist() == [1]
    assert judged.summary.llm_calls_filtered == 3


@pytest.mark.parametrize("form", FORMS)
def test_rewards_never_land_on_calls_without_ids(tmp_path: Path, rows: SpanRows, form: str) -> None:
    r = Rollout(rows, form)
    r.call(None, [1, 2], [3], 1)
    r.call(None, [], [], 3)  # empty arrays: no ids
    r.call(None, [1, 2, 3], [], 5)  # nothing sampled: no ids either
    if form != "agentlightning":  # our SDK without ids and without a tokenizer
        r.call(None, None, None, 7, token_source=sc.SOURCE_NONE, logprobs=[])
    r.reward(None, 1.0, 20)  # the newest call with ids is the first one
    r.reward(None, 0.5, 21)  # no other call with ids: unmatched, and said so
    rows.write(tmp_path)
    for policy in ("nearest", "sibling", "link"):
        result = build(tmp_path, reward_policy=policy)
        (t,) = result.triplets.to_pylist()
        assert (t["turn"], t["reward"]) == (0, 1.0)
        (traj,) = result.trajectories.to_pylist()
        assert (traj["reward"], traj["num_turns"], len(traj["tokens"])) == (1.0, 1, 3)
        s = result.summary
        assert (s.rewards_matched, s.rewards_unmatched, s.triplets) == (1, 1, 1)
        assert s.llm_calls_without_tokens == s.llm_calls - 1 == (2 if form == "agentlightning" else 3)
    final = build(tmp_path, reward_policy="final")
    assert final.triplets.column("reward").to_pylist() == [0.5]
    assert (final.summary.rewards_matched, final.summary.rewards_superseded) == (1, 1)


@pytest.mark.parametrize("form", FORMS)
def test_reward_of_a_rollout_without_trainable_calls_is_unmatched(
    tmp_path: Path, rows: SpanRows, form: str
) -> None:
    r = Rollout(rows, form)
    r.call(None, [], [], 1)
    r.reward(None, 1.0, 5)
    rows.write(tmp_path)
    for policy in ("nearest", "final"):
        result = build(tmp_path, reward_policy=policy)
        assert (result.triplets.num_rows, result.trajectories.num_rows) == (0, 0)
        s = result.summary
        assert (s.rewards_matched, s.rewards_unmatched, s.llm_calls_without_tokens) == (0, 1, 1)
