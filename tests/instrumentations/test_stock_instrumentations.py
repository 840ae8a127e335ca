"""Traces from the real instrumentation packages, with no tinkertrace SDK in the agent, become
training data: OpenInference (exact ids from its ``output.value``), OpenLLMetry, the official GenAI
instrumentation (its message content on the span, or, in its default mode, as one OTLP log event per
message and per choice) and Logfire (text only: re-tokenised with ``--tokenizer``), rewards written the
GenAI way, rollouts from the traces' root spans (task id from ``--task-key``).

Each agent runs in ``.venv-instrumentations`` against the real sampling endpoint (scripted model,
built-in tokenizer) and exports with the stock OTLP/HTTP exporter to a real collector process.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from tinkertrace.builder import BuildSettings, build_trajectories
from tinkertrace.cli.main import app
from tinkertrace.models.tokenizer import BUILTIN_MODEL, load_tokenizer
from tinkertrace.spanstore.logs import LOGS_FOLDER

ROLLOUTS = 3
CALLS = 3  # per rollout: plain, with a tool, streamed
TEXT_ONLY = ("openllmetry", "openai-v2", "openai-v2-messages", "logfire")


def sampled(endpoint: Any) -> tuple[list[list[int]], list[list[int]]]:
    """The prompt ids the endpoint sampled from and the response ids it sampled, in call order."""
    tokenizer = load_tokenizer(BUILTIN_MODEL)
    prompts = [prompt for prompt, *_ in endpoint.sampler.calls]
    eos = tokenizer.eos_token_id
    responses = [[*tokenizer.encode(r, add_special_tokens=False), eos] for r in endpoint.model.replies]
    return prompts, responses


def logged_events(spans_dir: Path) -> dict[str, int]:
    """How many log records of each event name the collector wrote under ``spans_dir``."""
    names = pq.read_table(spans_dir / LOGS_FOLDER, columns=["event_name"]).column("event_name")
    return dict(Counter(names.to_pylist()))


@pytest.mark.slow
@pytest.mark.parametrize("instrumentation", ["openinference", *TEXT_ONLY])
def test_stock_instrumentation_becomes_triplets(
    instrumentation: str, endpoint: Any, agent: Any, tmp_path: Path
) -> None:
    first = len(endpoint.sampler.calls)
    results = agent(instrumentation, ROLLOUTS, tmp_path / "spans", endpoint.url)
    prompts, responses = (ids[first:] for ids in sampled(endpoint))
    if instrumentation == "openai-v2-messages":  # the content is in the log events, not on the spans
        events = logged_events(tmp_path / "spans")
        assert events["gen_ai.user.message"] == events["gen_ai.choice"] == ROLLOUTS * CALLS, events
    assert len(prompts) == ROLLOUTS * CALLS and [r["reward"] for r in results] == [1.0] * ROLLOUTS

    options = BuildSettings(task_key="task.id", tokenizer=BUILTIN_MODEL, reward_policy="link")
    built = build_trajectories(tmp_path / "spans", tmp_path / "out", options)
    summary = built.summary
    assert (summary.rollouts_built, summary.llm_calls, summary.triplets) == (ROLLOUTS, 9, 9), summary
    source = "server" if instrumentation == "openinference" else "retokenized"
    assert summary.triplets_by_token_source == {source: 9}
    assert summary.llm_calls_retokenized == (0 if source == "server" else 9)
    # two GenAI rewards per rollout: the root span's event and the span linked to the tool call
    assert (summary.rewards, summary.rewards_matched, summary.rewards_unmatched) == (6, 6, 0)

    calls = sorted(built.triplets.to_pylist(), key=lambda t: (t["task_id"], t["turn"]))
    assert [c["task_id"] for c in calls] == [f"task-{i}" for i in range(ROLLOUTS) for _ in range(CALLS)]
    assert [c["response_token_ids"] for c in calls] == responses  # sampled ids, rebuilt or exact
    differs = [i % CALLS for i, c in enumerate(calls) if c["prompt_token_ids"] != prompts[i]]
    # the official instrumentation records no tool definitions: that prompt lacks the tools' text
    assert differs == ([1] * ROLLOUTS if instrumentation.startswith("openai-v2") else [])
    tool_rewards = [c["reward"] for c in calls if c["turn"] == 1]
    assert tool_rewards == [1.0] * ROLLOUTS  # `used_tool`, linked by gen_ai.response.id


@pytest.mark.slow
def test_text_only_spans_without_tokenizer_exit_non_zero_with_a_hint(
    endpoint: Any, agent: Any, tmp_path: Path
) -> None:
    agent("openllmetry", 1, tmp_path / "spans", endpoint.url)
    runner = CliRunner()
    args = ["build-trajectories", str(tmp_path / "spans"), "-o", str(tmp_path / "out")]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "3 LLM spans carry text but no token ids: pass --tokenizer" in " ".join(result.output.split())
    result = runner.invoke(app, [*args, "--tokenizer", BUILTIN_MODEL])
    assert result.exit_code == 0, result.output


@pytest.mark.slow
def test_our_sdk_beside_openinference_counts_each_call_once(
    endpoint: Any, agent: Any, tmp_path: Path
) -> None:
    rollouts = 20
    agent("openinference", rollouts, tmp_path / "spans", endpoint.url, "--with-sdk")
    summary = build_trajectories(tmp_path / "spans", tmp_path / "out").summary
    assert summary.llm_spans_by_producer == {"openinference": 60, "tinkertrace": 60}
    assert (summary.rollouts_built, summary.llm_calls, summary.triplets) == (rollouts, 60, 60)
    assert summary.llm_duplicates == 60 and summary.triplets_by_token_source == {"server": 60}


@pytest.mark.slow
def test_event_mode_content_arrives_as_otlp_logs_and_joins_its_spans(
    endpoint: Any, agent: Any, tmp_path: Path
) -> None:
    """The official instrumentation in event mode sends the messages as OTLP log records to
    ``/v1/logs`` (and the app its reward event): the collector keeps them (``_logs/``), the builder
    joins them to their spans."""
    first = len(endpoint.sampler.calls)
    agent("openai-v2-events", 2, tmp_path / "spans", endpoint.url)
    prompts, responses = (ids[first:] for ids in sampled(endpoint))
    assert list((tmp_path / "spans" / "_logs").rglob("*.parquet"))
    options = BuildSettings(task_key="task.id", tokenizer=BUILTIN_MODEL)
    built = build_trajectories(tmp_path / "spans", tmp_path / "out", options)
    assert (built.summary.triplets, built.summary.llm_calls_retokenized) == (6, 6), built.summary
    assert (built.summary.rewards, built.summary.rewards_matched) == (4, 4)
    calls = sorted(built.triplets.to_pylist(), key=lambda t: (t["task_id"], t["turn"]))
    assert [c["response_token_ids"] for c in calls] == responses
    assert [c["prompt_token_ids"] == p for c, p in zip(calls, prompts, strict=True)] == [
        True,
        False,
        True,
    ] * 2
