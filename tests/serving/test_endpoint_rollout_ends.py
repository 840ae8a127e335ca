"""Rewards and rollout ends posted to a recording endpoint build what the user meant (issue 37, "What
was seen" 4 and 5): docs/endpoint_capture.md's examples build with every reward matched, and the build
names the rollouts it leaves out as unfinished, with the flag that would include them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from typer.testing import CliRunner

from tinkertrace.builder import build_trajectories
from tinkertrace.builder.options import BuildSettings
from tinkertrace.cli.main import app

MODEL = "scripted-model"


def _rollout(url: str, rollout_id: str, turns: int) -> list[str]:
    """An agent's rollout through the URL prefix: ``turns`` calls; their response ids."""
    client = openai.OpenAI(base_url=f"{url}/rollouts/{rollout_id}/task/t-1/v1", api_key="k", max_retries=0)
    return [
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"q{i}"}]).id
        for i in range(turns)
    ]


def _post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = httpx.post(f"{url}/v1/rollouts/{path}", json=body, timeout=10)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def test_the_docs_examples_build_with_every_reward_matched(
    recording_endpoint: Callable[..., Any], tmp_path: Path
) -> None:
    endpoint = recording_endpoint("serve", ["one", "two", "three"])
    # the quickstart: one reward (two dimensions) and the end of each rollout
    for rid in ("r-1", "r-2"):
        _rollout(endpoint.url, rid, 1)
        _post(endpoint.url, f"{rid}/reward", {"value": {"correct": 1, "style": 0.5}, "primary": "correct"})
        _post(endpoint.url, f"{rid}/finish", {"status": "succeeded"})
    # "Rewards and rollout ends": one reward per call, each naming its answer (built with link)
    first, second = _rollout(endpoint.url, "r-3", 2)
    _post(endpoint.url, "r-3/reward", {"value": 0.2, "response_id": second})
    _post(endpoint.url, "r-3/reward", {"value": 0.8, "response_id": first})
    assert _post(endpoint.url, "r-3/finish", {}) == {
        "rollout_id": "r-3",
        "status": "succeeded",
        "llm_calls": 2,
        "rewards": 2,
    }
    assert endpoint.recorder.flush(30)
    result = build_trajectories(endpoint.spans, tmp_path / "out", BuildSettings(reward_policy="link"))
    summary = result.summary
    assert (summary.rewards, summary.rewards_matched, summary.rewards_unmatched) == (4, 4, 0)
    assert summary.rollouts_built == 3 and summary.incomplete_rollout_ids == []
    rewards = {t["response_id"]: t["reward"] for t in result.triplets.to_pylist() if t["rollout_id"] == "r-3"}
    assert rewards == {first: pytest.approx(0.8), second: pytest.approx(0.2)}


def test_the_build_names_unfinished_rollouts_their_rewards_and_the_flag(
    recording_endpoint: Callable[..., Any], tmp_path: Path
) -> None:
    endpoint = recording_endpoint("serve", ["a"])
    for rid in ("r-done", "r-open-rewarded", "r-open"):
        _rollout(endpoint.url, rid, 1)
    _post(endpoint.url, "r-open-rewarded/reward", {"value": 1})
    _post(endpoint.url, "r-done/reward", {"value": 1})
    _post(endpoint.url, "r-done/finish", {})
    assert endpoint.recorder.flush(30)
    out = CliRunner().invoke(app, ["build-trajectories", str(endpoint.spans), "-o", str(tmp_path / "out")])
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "2 rollouts left out as incomplete (r-open, r-open-rewarded), 1 of them with rewards" in text, (
        out.output
    )
    assert "/finish" in text and "--include-incomplete builds them" in text
    included = CliRunner().invoke(
        app, ["build-trajectories", str(endpoint.spans), "-o", str(tmp_path / "all"), "--include-incomplete"]
    )
    assert included.exit_code == 0 and "left out as incomplete" not in " ".join(included.output.split())
