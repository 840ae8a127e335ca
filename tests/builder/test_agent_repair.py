"""Spans written by the real OpenTelemetry SDK without ours, through the embedded Parquet sink: a call
made on a bare ``threading.Thread`` (no context: a root span of its own trace) takes the agent span
that encloses it in time; a plain trace's rollout status comes from its root span's OTel status.

Our SDK cannot make the first case: on a bare thread it sees no rollout and records no call. An
Agent-lightning process can: its rollout id is a resource attribute, on every span of the process."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import openai
import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Status, StatusCode, Tracer

from tinkertrace import semconv as sc
from tinkertrace.builder import BuildSettings, build_trajectories
from tinkertrace.sdk.parquet_exporter import ParquetSpanExporter


@pytest.fixture
def spans(tmp_path: Path) -> Path:
    return tmp_path / "spans"


def _provider(spans: Path, resource: dict[str, Any] | None = None) -> TracerProvider:
    provider = TracerProvider(resource=Resource.create(resource or {}))
    provider.add_span_processor(SimpleSpanProcessor(ParquetSpanExporter(spans)))
    return provider


def _traced_call(tracer: Tracer, client: openai.OpenAI, question: str) -> str:
    """One real call to the vLLM-shaped server, recorded as Agent-lightning's LLM span (the server's
    token ids); returns its response id."""
    with tracer.start_as_current_span(sc.AGL_LLM_SPAN_NAMES[0]) as span:
        r = client.chat.completions.create(
            model="test-model",
            messages=[{"role": "user", "content": question}],
            extra_body={"return_token_ids": True},
        )
        answer = r.model_dump()
        span.set_attributes({
            sc.GENAI_RESPONSE_ID: r.id,
            sc.AGL_PROMPT_TOKEN_IDS: answer["prompt_token_ids"],
            sc.AGL_RESPONSE_TOKEN_IDS: answer["choices"][0]["token_ids"],
        })  # fmt: skip
    return r.id


def _on_bare_thread(fn: Any) -> str:
    """``fn()`` run on a plain ``threading.Thread``: it starts with an empty context."""
    out: list[str] = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join()
    return out[0]


def test_call_on_a_bare_thread_takes_the_agent_span_enclosing_it(spans: Path, openai_server: Any) -> None:
    client = openai.OpenAI(base_url=openai_server.base_url, api_key="test")
    # an Agent-lightning process running rollout ro-1
    provider = _provider(spans, {sc.AGL_ROLLOUT_ID: "ro-1", sc.AGL_ATTEMPT_ID: "0"})
    tracer = provider.get_tracer("agent")
    with tracer.start_as_current_span("solver", attributes={sc.FOREIGN_AGENT_NAME: "solver"}):
        lost = _on_bare_thread(lambda: _traced_call(tracer, client, "lost"))
        with tracer.start_as_current_span("judge", attributes={sc.FOREIGN_AGENT_NAME: "judge"}):
            judged = _traced_call(tracer, client, "judged")  # in context: its chain has the judge
        with tracer.start_as_current_span(sc.AGL_REWARD_SPAN, attributes={"reward": 1.0}):
            pass  # the solver's reward, after the judge's call
    outside = _on_bare_thread(lambda: _traced_call(tracer, client, "outside"))  # no agent span then
    provider.shutdown()  # the sink closes its files

    result = build_trajectories(spans)
    calls = {t["response_id"]: t for t in result.triplets.to_pylist()}
    assert set(calls) == {lost, judged, outside}
    assert {t["rollout_id"] for t in calls.values()} == {"ro-1"}
    # the lost call is the solver's, in the solver's scope: the solver's reward is its, not the judge's
    assert (calls[lost]["agent_name"], calls[lost]["reward"]) == ("solver", 1.0)
    assert (calls[judged]["agent_name"], calls[judged]["reward"]) == ("judge", None)
    assert (calls[outside]["agent_name"], calls[outside]["reward"]) == (None, None)
    rewards = {t["agent_name"]: t["reward"] for t in result.trajectories.drop(["end_time"]).to_pylist()}
    assert rewards == {"solver": 1.0, "judge": None, None: None}
    assert result.summary.rewards_matched == 1


@pytest.mark.parametrize(
    ("status", "expected"),
    [(StatusCode.ERROR, sc.STATUS_FAILED), (StatusCode.OK, sc.STATUS_SUCCEEDED),
     (StatusCode.UNSET, sc.STATUS_SUCCEEDED)],
)  # fmt: skip
def test_plain_trace_rollout_status_is_its_root_spans(spans: Path, status: StatusCode, expected: str) -> None:
    provider = _provider(spans)
    tracer = provider.get_tracer("app")
    with tracer.start_as_current_span("other app root"):
        pass  # a second plain trace, gone well, so a filter has something to leave out
    with tracer.start_as_current_span("run", set_status_on_exception=False) as root:
        with tracer.start_as_current_span("chat test-model", attributes={sc.GENAI_OPERATION: "chat"}):
            pass
        if status is not StatusCode.UNSET:
            root.set_status(Status(status))
    provider.shutdown()
    trace_id = format(root.get_span_context().trace_id, "032x")

    built = {
        s: build_trajectories(spans, None, BuildSettings(statuses=(s,))).summary.rollout_ids
        for s in (sc.STATUS_FAILED, sc.STATUS_SUCCEEDED, "unknown")
    }
    assert trace_id in built[expected]
    assert built["unknown"] == []
    assert len(built[sc.STATUS_FAILED]) == (1 if expected == sc.STATUS_FAILED else 0)
    assert len(built[sc.STATUS_SUCCEEDED]) == (1 if expected == sc.STATUS_FAILED else 2)
