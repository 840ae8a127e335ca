"""The TypeScript agent (examples/ts_agent): real Node, the real `openai` npm package, no tinkertrace code
in the agent. The endpoint records its calls; its rewards and ends arrive over HTTP; it trains end to end.

``make ts-agent`` (a prerequisite of ``make test``) installs Node when missing, the npm packages, and
compiles the agent.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from tinkertrace import semconv
from tinkertrace.models.tokenizer import BUILTIN_MODEL, load_tokenizer
from tinkertrace.netutil import BackgroundServer
from tinkertrace.online.demo_agent import identity_reward
from tinkertrace.serving.app import create_app
from tinkertrace.serving.policy import PolicyHolder
from tinkertrace.serving.recording import CallRecorder
from tinkertrace.spanstore.reader import open_spans
from tinkertrace.testing.environments import require_built
from tinkertrace.testing.scripted_sampler import ScriptedTinkerSampler

SIDE = f"json_extract_string(attributes, '$.\"{semconv.LLM_CAPTURE_SIDE}\"')"
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from examples.ts_agent.train import AGENT_JS, agent_command, train  # noqa: E402

require_built(shutil.which("node") is not None and AGENT_JS.exists(), f"node or {AGENT_JS}", "ts-agent")


def _spans(folder: Path, sql: str) -> list[tuple]:
    con = duckdb.connect()
    open_spans(con, folder)
    return con.execute(sql).fetchall()


def test_the_agents_calls_rewards_and_ends_are_recorded_by_the_endpoint(tmp_path: Path) -> None:
    replies = ["I am tinkertrace.", "I am a model", "who knows"]
    recorder = CallRecorder(spans_dir=tmp_path / "spans")
    policy = PolicyHolder(ScriptedTinkerSampler(replies), load_tokenizer(BUILTIN_MODEL), "scripted-model")
    with BackgroundServer(create_app(policy, recorder=recorder)) as server:
        command = agent_command(server.url, "scripted-model", worker=0, group_size=3, max_tokens=30)
        done = subprocess.run([*command, "--rounds", "1"], capture_output=True, text=True, timeout=120)
        assert recorder.flush(30)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(rows) == 3 and not [r for r in rows if "error" in r]
    for row in rows:  # the TypeScript reward is the demo's reward
        assert row["reward"] == pytest.approx(identity_reward(row["reply"]))

    spans = tmp_path / "spans"
    llm = _spans(
        spans,
        "SELECT rollout_id, task_id, response_id, len(response_token_ids), "
        f"{SIDE} FROM spans WHERE span_type = 'llm'",
    )
    expected = {(r["rollout_id"], r["task_id"], r["response_id"]) for r in rows}
    assert {row[:3] for row in llm} == expected
    assert all(row[3] > 0 and row[4] == semconv.CAPTURE_SERVER for row in llm)
    rewards = _spans(
        spans, "SELECT rollout_id, response_id, reward_value FROM spans WHERE span_type = 'reward'"
    )
    assert sorted(rewards) == sorted((r["rollout_id"], r["response_id"], r["reward"]) for r in rows)
    counts = ", ".join(
        f"json_extract_string(attributes, '$.\"{name}\"')"
        for name in (semconv.ROLLOUT_STATUS, semconv.ROLLOUT_LLM_CALLS, semconv.ROLLOUT_REWARDS)
    )
    roots = _spans(spans, f"SELECT rollout_id, task_id, {counts} FROM spans WHERE span_type = 'rollout'")
    assert sorted(roots) == sorted((r["rollout_id"], r["task_id"], "succeeded", "1", "1") for r in rows)


@pytest.mark.slow
def test_the_typescript_agent_trains_end_to_end(tmp_path: Path) -> None:
    summary = train(
        tmp_path / "run",
        steps=2,
        workers=1,
        group_size=4,
        groups_per_batch=1,
        model=BUILTIN_MODEL,
        max_seconds=300,
    )
    assert summary["steps"] == 2 and summary["policy_version"] == 2
    assert summary["rollouts_trained"] >= 8 and summary["rollouts_failed"] == 0
    versions = _spans(
        tmp_path / "run" / "spans",
        f"SELECT DISTINCT policy_version, {SIDE} FROM spans WHERE span_type = 'llm'",
    )
    assert {side for _, side in versions} == {semconv.CAPTURE_SERVER}
    assert max(v for v, _ in versions) >= 1  # later rollouts sampled a policy the trainer published
