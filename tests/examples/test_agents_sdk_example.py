"""examples/agents_sdk: an OpenAI Agents SDK agent, run in its own environment (.venv-agents, built by
``make agents-env``), against the real sampling endpoint; then trained end to end.

The first test scripts the model (a hosted-Tinker double behind the real endpoint) so the agent's
whole tool loop runs, with ``Runner.run`` and ``Runner.run_streamed``: a ``function_call`` the SDK
executes, then the final answer. The spans each run leaves carry exactly the token ids the endpoint
sampled, and build into one two-turn trajectory.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tinkertrace.builder import build_trajectories
from tinkertrace.models.tokenizer import BUILTIN_MODEL, load_tokenizer
from tinkertrace.netutil import BackgroundServer
from tinkertrace.serving.app import create_app
from tinkertrace.serving.policy import PolicyHolder
from tinkertrace.testing.environments import require_built
from tinkertrace.testing.scripted_sampler import ScriptedTinkerSampler
from tinkertrace.training.config import make_config
from tinkertrace.training.environments import environment_rows

ROOT = Path(__file__).resolve().parents[2]
AGENTS_PYTHON = ROOT / ".venv-agents" / "bin" / "python"
require_built(AGENTS_PYTHON.exists(), "the Agents SDK example's environment (.venv-agents)", "agents-env")

RUN_ONE = """
import json, sys
import tinkertrace
from examples.agents_sdk.agent import solve
tinkertrace.init(spans_dir=sys.argv[1])
task = {"expression": "12 + 30"}
url = sys.argv[2]
results = [
    solve({**task, "id": f"sdk-{stream}"}, base_url=url, model="test-model", stream=stream)
    for stream in (False, True)
]
tinkertrace.flush()
print(json.dumps(results))
"""


def test_agent_runs_its_tool_loop_and_leaves_the_sampled_ids(tmp_path: Path) -> None:
    tokenizer = load_tokenizer(BUILTIN_MODEL)
    replies: list[str] = []

    def model(prompt_ids: list[int]) -> str:
        prompt = tokenizer.decode(prompt_ids)
        if "<tool_response>" in prompt:
            reply = (
                "The answer is " + re.findall(r"<tool_response>\n(.*?)\n</tool_response>", prompt)[-1] + "."
            )
        else:
            expression = re.findall(r"What is (.*?)\?", prompt)[-1]
            arguments = json.dumps({"expression": expression})
            reply = f'<tool_call>\n{{"name": "calculator", "arguments": {arguments}}}\n</tool_call>'
        replies.append(reply)
        return reply

    sampler = ScriptedTinkerSampler(model)
    with BackgroundServer(create_app(PolicyHolder(sampler, tokenizer, "test-model"))) as endpoint:
        spans = tmp_path / "spans"
        proc = subprocess.run(
            [str(AGENTS_PYTHON), "-c", RUN_ONE, str(spans), endpoint.url + "/v1"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results == [{"reward": 1.0, "answer": "The answer is 42.", "finished": True}] * 2
    assert len(replies) == 4 and replies[0].startswith("<tool_call>") and replies[2] == replies[0]

    built = build_trajectories(spans)
    calls = sorted(built.triplets.to_pylist(), key=lambda r: (r["task_id"], r["turn"]))
    assert [c["task_id"] for c in calls] == ["sdk-False", "sdk-False", "sdk-True", "sdk-True"]
    assert [c["prompt_token_ids"] for c in calls] == [prompt for prompt, *_ in sampler.calls]
    eos = tokenizer.eos_token_id
    expected = [[*tokenizer.encode(r, add_special_tokens=False), eos] for r in replies]
    assert [c["response_token_ids"] for c in calls] == expected  # streamed or not: the sampled ids
    assert {c["token_source"] for c in calls} == {"server"} and {c["policy_version"] for c in calls} == {0}
    trajectories = built.trajectories.drop_columns(["end_time"]).to_pylist()
    # one trajectory per rollout: each second prompt extends the first call
    assert [(t["num_turns"], t["reward"]) for t in trajectories] == [(2, 1.0), (2, 1.0)]


@pytest.mark.slow
def test_agents_sdk_example_trains_online(tmp_path: Path) -> None:
    """`tinkertrace train --follow --config examples/agents_sdk/config.yaml`, shortened: its workers run
    in the example's own environment (``follow.worker_python``)."""
    command = [
        sys.executable, "-m", "tinkertrace.cli.main", "train", "--follow",
        "--config", str(ROOT / "examples" / "agents_sdk" / "config.yaml"), "--log-dir", str(tmp_path),
        "--model", "tinkertrace/tiny-chat:nano", "--lora-rank", "2", "--max-steps", "1", "--workers", "1",
        "--groups-per-batch", "1", "--group-timeout", "30", "--max-seconds", "150",
        "--keep-constant-reward-groups", "--no-progress",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["served_version"] == 1, summary
    assert summary["agent_errors"] == [] and summary["environments"]["agents_sdk"]["rollouts"] >= 2
    (env,) = make_config(ROOT / "examples" / "agents_sdk" / "config.yaml").environments
    rows = environment_rows(tmp_path / "spans", env).table
    assert rows.num_rows >= 2 and all(0.0 <= r <= 1.0 for r in rows["reward"].to_pylist())
    worker_log = (tmp_path / "agents" / "worker-0.jsonl").read_text().splitlines()
    assert worker_log and all(json.loads(line)["error"] is None for line in worker_log)
