"""Builder acceptance: real SDK rollouts against the local OpenAI-compatible test server, spans
written by the embedded Parquet sink, triplets and trajectories checked exactly."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import tinkertrace
from tinkertrace import schemas
from tinkertrace.builder import BuildSettings, build_trajectories
from tinkertrace.testing.openai_server import byte_logprob, render_chat

Msgs = list[dict[str, Any]]


def ids(text: str) -> list[int]:
    return list(text.encode())


def trajs(result: Any) -> list[dict[str, Any]]:
    """Trajectory rows as dicts (end_time left out: ns timestamps do not convert to datetime)."""
    return result.trajectories.drop(["end_time"]).to_pylist()


def lps(text: str) -> list[float]:
    return [byte_logprob(b) for b in text.encode()]


class Agent:
    """A small chat agent on the real OpenAI client, traced by the SDK into ``spans``."""

    def __init__(self, spans: Path, base_url: str) -> None:
        self.spans = spans
        self.client = openai.OpenAI(base_url=base_url, api_key="test")

    def chat(self, messages: Msgs) -> tuple[str, str]:
        """(reply text, response id) of one call; the reply is ``echo: <last user message>``."""
        r = self.client.chat.completions.create(model="test-model", messages=messages)
        return r.choices[0].message.content or "", r.id

    def build(self, **opts: Any) -> Any:
        tinkertrace.flush()
        return build_trajectories(self.spans, None, BuildSettings(**opts))


@pytest.fixture
def agent(tmp_path: Path, openai_server: Any) -> Iterator[Agent]:
    spans = tmp_path / "spans"
    tinkertrace.init(spans_dir=spans)
    yield Agent(spans, openai_server.base_url)
    tinkertrace.shutdown()


def conversation(agent: Agent, questions: list[str], *, rewards: list[float] | None = None) -> list[str]:
    """A multi-turn chat inside the current rollout; returns the response ids."""
    msgs: Msgs = []
    rids = []
    for i, q in enumerate(questions):
        msgs.append({"role": "user", "content": q})
        reply, rid = agent.chat(msgs)
        rids.append(rid)
        msgs.append({"role": "assistant", "content": reply})
        if rewards is not None:
            tinkertrace.emit_reward(rewards[i])
    return rids


def test_single_turn_triplet_and_trajectory_exact(agent: Agent) -> None:
    @tinkertrace.traced_rollout
    def solve(task: dict[str, str]) -> float:
        agent.chat([{"role": "user", "content": task["q"]}])
        return 1.0

    solve({"id": "t-1", "q": "hi"})
    result = agent.build()
    prompt = render_chat([{"role": "user", "content": "hi"}])
    assert result.triplets.schema == schemas.triplets()
    assert result.trajectories.schema == schemas.trajectories()
    (t,) = result.triplets.to_pylist()
    assert (t["task_id"], t["turn"], t["attempt"], t["model"]) == ("t-1", 0, 0, "test-model")
    assert t["prompt_token_ids"] == ids(prompt)
    assert t["response_token_ids"] == ids("echo: hi")
    assert t["response_logprobs"] == lps("echo: hi")
    assert (t["token_source"], t["reward"]) == ("server", 1.0)
    (traj,) = trajs(result)
    assert traj["tokens"] == ids(prompt + "echo: hi")
    assert traj["action_mask"] == [0] * len(ids(prompt)) + [1] * 8
    assert traj["logprobs"] == [0.0] * len(ids(prompt)) + lps("echo: hi")
    assert (traj["reward"], traj["num_turns"], traj["segment"], traj["split_reason"]) == (1.0, 1, 0, None)
    assert (traj["group_key"], traj["split"]) == ("t-1", "train")
    s = result.summary
    assert (s.rollouts_built, s.triplets, s.trajectories, s.rewards_matched, s.rewards_unmatched) == (
        1,
        1,
        1,
        1,
        0,
    )


def test_multi_turn_merges_into_one_trajectory(agent: Agent) -> None:
    @tinkertrace.traced_rollout
    def solve(task: dict[str, str]) -> None:
        conversation(agent, ["a", "bb", "ccc"], rewards=[0.25, 0.5, 1.0])

    solve({"id": "t-2"})
    result = agent.build()
    trips = result.triplets.to_pylist()
    assert [t["turn"] for t in trips] == [0, 1, 2]
    assert [t["reward"] for t in trips] == [0.25, 0.5, 1.0]
    (traj,) = trajs(result)
    full = render_chat(
        [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "echo: a"},
            {"role": "user", "content": "bb"},
            {"role": "assistant", "content": "echo: bb"},
            {"role": "user", "content": "ccc"},
        ]
    )
    assert traj["tokens"] == ids(full + "echo: ccc")
    assert traj["num_turns"] == 3
    assert traj["reward"] == 1.75  # sum of the rewards assigned to its turns
    mask = traj["action_mask"]
    assert sum(mask) == len("echo: a") + len("echo: bb") + len("echo: ccc")
    for t in trips:  # each response sits right after its own prompt, with its logprobs
        start = len(t["prompt_token_ids"])
        n = len(t["response_token_ids"])
        assert traj["tokens"][start : start + n] == t["response_token_ids"]
        assert mask[start : start + n] == [1] * n
        assert traj["logprobs"][start : start + n] == t["response_logprobs"]


def test_prefix_breaks_are_split_and_diagnosed(agent: Agent) -> None:
    @tinkertrace.traced_rollout
    def solve(task: dict[str, str]) -> None:
        msgs: Msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "x"}]
        reply, _ = agent.chat(msgs)
        # the agent edits the reply before sending it back: its history changed
        msgs += [{"role": "assistant", "content": reply.upper()}, {"role": "user", "content": "y"}]
        reply, _ = agent.chat(msgs)
        # then swaps its system prompt: the history itself changed
        msgs[0] = {"role": "system", "content": "be verbose"}
        msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": "z"}]
        agent.chat(msgs)
        # then extends that prompt properly: merges with the previous turn
        msgs += [{"role": "assistant", "content": "echo: z"}, {"role": "user", "content": "w"}]
        agent.chat(msgs)

    solve({"id": "t-3"})
    result = agent.build()
    rows = trajs(result)
    assert [r["segment"] for r in rows] == [0, 1, 2]
    # (with byte tokens nothing re-tokenises differently: retokenization_drift needs BPE, test_bpe.py)
    assert [r["split_reason"] for r in rows] == [None, "template_change", "template_change"]
    assert [r["num_turns"] for r in rows] == [1, 1, 2]
    assert result.summary.trajectory_splits == {"template_change": 2}


def test_two_agents_in_one_rollout(agent: Agent) -> None:
    @tinkertrace.traced_rollout
    def solve(task: dict[str, str]) -> None:
        with tinkertrace.agent_span("solver"):
            conversation(agent, ["p", "q"])
            tinkertrace.emit_reward(1.0)
        with tinkertrace.agent_span("critic"):
            conversation(agent, ["r"])
            tinkertrace.emit_reward(0.5)

    solve({"id": "t-4"})
    result = agent.build(group_by="task+agent")
    trips = result.triplets.to_pylist()
    assert [(t["agent_name"], t["turn"], t["reward"]) for t in trips] == [
        ("solver", 0, None),
        ("solver", 1, 1.0),
        ("critic", 2, 0.5),
    ]
    rows = trajs(result)
    assert [(r["agent_name"], r["num_turns"], r["reward"], r["group_key"]) for r in rows] == [
        ("critic", 1, 0.5, "t-4::critic"),
        ("solver", 2, 1.0, "t-4::solver"),
    ]
    by_task = trajs(agent.build())  # one group; agents in name order within the rollout
    assert [(r["agent_name"], r["group_key"]) for r in by_task] == [("critic", "t-4"), ("solver", "t-4")]
    only_critic = agent.build(agent="^crit")
    assert [t["agent_name"] for t in only_critic.triplets.to_pylist()] == ["critic"]
    assert only_critic.summary.llm_calls_filtered == 2


def _reward_scenario(agent: Agent) -> list[str]:
    """Calls c0, c1; a reward linked to c0 emitted after c1, then the returned final reward."""
    rids: list[str] = []

    @tinkertrace.traced_rollout
    def solve(task: dict[str, str]) -> float:
        rids.extend(conversation(agent, ["a", "b"]))
        tinkertrace.emit_reward(0.3, response_id=rids[0])
        return 2.0

    solve({"id": "t-5"})
    return rids


@pytest.mark.parametrize(
    ("policy", "call_rewards", "traj_reward", "unmatched", "superseded"),
    [
        ("nearest", [2.0, 0.3], 2.3, 0, 0),  # 0.3 → newest unrewarded (c1), 2.0 → c0
        ("sibling", [2.0, 0.3], 2.3, 0, 0),  # all siblings under the rollout span
        ("link", [0.3, 2.0], 2.3, 0, 0),  # 0.3 → c0 by its response id, 2.0 → c1
        ("final", [2.0, 2.0], 2.0, 0, 1),  # the final reward on every call
    ],
)
def test_reward_policies(
    agent: Agent, policy: str, call_rewards: list[float], traj_reward: float, unmatched: int, superseded: int
) -> None:
    _reward_scenario(agent)
    result = agent.build(reward_policy=policy)
    assert [t["reward"] for t in result.triplets.to_pylist()] == call_rewards
    assert result.trajectories.column("reward").to_pylist() == [pytest.approx(traj_reward)]
    assert (result.summary.rewards_unmatched, result.summary.rewards_superseded) == (unmatched, superseded)


def test_reward_dimension_by_name(agent: Agent) -> None:
    @tinkertrace.traced_rollout
    def solve(task: dict[str, str]) -> None:
        conversation(agent, ["a"])
        tinkertrace.emit_reward({"correct": 1.0, "brevity": 0.25}, primary="correct")

    solve({"id": "t-6"})
    assert agent.build().triplets.column("reward").to_pylist() == [1.0]
    assert agent.build(reward_name="brevity").triplets.column("reward").to_pylist() == [0.25]
    missing = agent.build(reward_name="style")
    assert missing.triplets.column("reward").to_pylist() == [None]
    assert missing.summary.rewards_missing_dimension == 1


def test_unmatched_rewards_are_reported(agent: Agent) -> None:
    @tinkertrace.traced_rollout
    def solve(task: dict[str, str]) -> None:
        tinkertrace.emit_reward(0.7)  # before any LLM call: nothing to reward
        conversation(agent, ["a"], rewards=[1.0])
        tinkertrace.emit_reward(0.1)  # the only call already has its reward

    solve({"id": "t-7"})
    result = agent.build()
    assert result.triplets.column("reward").to_pylist() == [1.0]
    assert result.summary.rewards == 3
    assert result.summary.rewards_matched == 1
    assert result.summary.rewards_unmatched == 2
    rollout_id = result.triplets.column("rollout_id")[0].as_py()
    assert {r for r, _ in result.summary.unmatched_rewards} == {rollout_id}


def _sink_file(spans: Path) -> Path:
    (path,) = sorted(spans.rglob("*.parquet"))
    return path


def test_duplicate_delivery_is_deduplicated(agent: Agent) -> None:
    @tinkertrace.traced_rollout
    def solve(task: dict[str, str]) -> None:
        conversation(agent, ["a", "b"], rewards=[1.0, 0.0])

    solve({"id": "t-8"})
    tinkertrace.flush()
    path = _sink_file(agent.spans)
    shutil.copy(path, path.with_name("again-" + path.name))  # the same spans delivered twice
    result = agent.build()
    assert result.summary.llm_spans == 2
    assert [t["reward"] for t in result.triplets.to_pylist()] == [1.0, 0.0]
    assert result.trajectories.num_rows == 1
    assert result.summary.rewards == 2


def test_missing_parent_and_incomplete_rollouts(agent: Agent) -> None:
    @tinkertrace.traced_rollout
    def solve(task: dict[str, str]) -> None:
        with tinkertrace.agent_span("solver"):
            conversation(agent, ["a"], rewards=[1.0])

    solve({"id": "whole"})
    solve({"id": "lost-llm"})
    solve({"id": "lost-root"})
    tinkertrace.flush()
    path = _sink_file(agent.spans)
    table = pq.read_table(path)
    task, kind = table.column("task_id"), pc.fill_null(table.column("span_type"), "")
    drop = pc.or_(
        pc.or_(
            pc.and_(pc.equal(task, "whole"), pc.equal(kind, "agent")),  # parents of LLM + reward lost
            pc.and_(pc.equal(task, "lost-llm"), pc.equal(kind, "llm")),
        ),
        pc.and_(pc.equal(task, "lost-root"), pc.equal(kind, "rollout")),
    )
    pq.write_table(table.filter(pc.invert(drop)), path)
    for policy in ("nearest", "sibling"):
        result = agent.build(reward_policy=policy)
        assert result.triplets.column("task_id").to_pylist() == ["whole"]
        assert result.triplets.column("reward").to_pylist() == [1.0]
        assert result.summary.orphan_spans_repaired == 2
        assert result.summary.rollouts_incomplete == {"missing_llm_spans": 1, "root_missing": 1}
    forced = agent.build(include_incomplete=True)
    assert sorted(forced.triplets.column("task_id").to_pylist()) == ["lost-root", "whole"]


def test_corrupt_file_skipped_and_reported(agent: Agent) -> None:
    @tinkertrace.traced_rollout
    def solve(task: dict[str, str]) -> None:
        conversation(agent, ["a"], rewards=[1.0])

    solve({"id": "t-9"})
    tinkertrace.flush()
    bad = agent.spans / "date=2026-01-01" / "hour=00" / "broken.parquet"
    bad.parent.mkdir(parents=True, exist_ok=True)
    bad.write_bytes(b"PAR1 this is not parquet")
    result = agent.build()
    assert [p for p, _ in result.summary.corrupt_files] == [bad]
    assert result.triplets.num_rows == 1
    assert result.trajectories.num_rows == 1


def test_calls_without_token_ids_are_skipped_and_counted(agent: Agent, openai_server: Any) -> None:
    @tinkertrace.traced_rollout
    def solve(task: dict[str, str]) -> float:
        conversation(agent, ["a"])
        openai_server.options.token_ids = False  # a server without the extension, no tokenizer set
        conversation(agent, ["b"])
        return 1.0

    solve({"id": "t-10"})
    result = agent.build()
    assert result.summary.llm_calls == 2
    assert result.summary.llm_calls_without_tokens == 1
    assert result.triplets.column("turn").to_pylist() == [0]
    # the final reward skips the call without ids: the kept triplet, its trajectory and the summary agree
    assert result.triplets.column("reward").to_pylist() == [1.0]
    assert result.trajectories.column("reward").to_pylist() == [1.0]
    assert (result.summary.rewards_matched, result.summary.rewards_unmatched) == (1, 0)


def test_truncated_responses_are_marked(agent: Agent) -> None:
    @tinkertrace.traced_rollout
    def solve(task: dict[str, str]) -> float:
        agent.client.chat.completions.create(model="test-model", messages=[{"role": "user", "content": "a"}])
        agent.client.chat.completions.create(
            model="test-model", messages=[{"role": "user", "content": "long"}], max_tokens=4
        )  # the server stops at 4 tokens: finish reason "length"
        return 1.0

    solve({"id": "t-11"})
    trips = agent.build().triplets.to_pylist()
    assert [(t["response_token_ids"], t["truncated"]) for t in trips] == [
        (ids("echo: a"), False),
        (ids("echo"), True),
    ]


def test_failed_rollouts_kept_by_default_and_left_out_by_status(agent: Agent) -> None:
    @tinkertrace.traced_rollout
    def solve(task: dict[str, str]) -> None:
        conversation(agent, ["a"], rewards=[0.0 if task["fail"] else 1.0])
        if task["fail"]:
            raise RuntimeError("the agent crashed after its call")

    solve({"id": "ok", "fail": ""})
    with pytest.raises(RuntimeError):
        solve({"id": "crashed", "fail": "yes"})
    everything = agent.build()
    assert sorted(everything.triplets.column("task_id").to_pylist()) == ["crashed", "ok"]
    assert (everything.summary.rollouts_failed, everything.summary.rollouts_status_filtered) == (1, 0)
    succeeded = agent.build(statuses=["succeeded"])
    assert succeeded.triplets.column("task_id").to_pylist() == ["ok"]
    s = succeeded.summary
    assert (s.rollouts_built, s.rollouts_failed, s.rollouts_status_filtered) == (1, 0, 1)
    assert s.rollouts_filtered == 0
    assert agent.build(statuses=["failed"]).triplets.column("task_id").to_pylist() == ["crashed"]
    with pytest.raises(ValueError, match="statuses"):
        BuildSettings(statuses=["crashed"])


def test_abandoned_stream_is_a_truncated_triplet_with_its_reward(agent: Agent, openai_server: Any) -> None:
    openai_server.options.latency_s = 0.2  # 20 ms between chunks: the agent stops well before the end
    kept: list[Any] = []

    @tinkertrace.traced_rollout
    def solve(task: dict[str, str]) -> None:
        stream = agent.client.chat.completions.create(
            model="test-model", messages=[{"role": "user", "content": "a long question"}], stream=True
        )
        kept.append(stream)  # neither closed nor collected: the call ends with the rollout
        chunks, text = iter(stream), ""
        while len(text) < 4:  # the agent has what it wanted and stops reading
            text += next(chunks).choices[0].delta.content or ""
        tinkertrace.emit_reward(0.5)

    solve({"id": "t-12"})
    result = agent.build()
    (t,) = result.triplets.to_pylist()
    assert t["truncated"] is True and t["reward"] == 0.5
    n = len(t["response_token_ids"])
    assert (
        4 <= n < len("echo: a long question") and t["response_token_ids"] == ids("echo: a long question")[:n]
    )
    assert (result.summary.rewards_matched, result.summary.rewards_unmatched) == (1, 0)
    kept[0].close()
