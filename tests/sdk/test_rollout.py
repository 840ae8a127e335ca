"""@traced_rollout, emit_reward and agent_span: ids, context in threads and tasks, errors, config."""

from __future__ import annotations

import asyncio
import json
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import duckdb
import httpx
import numpy as np
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import tinkertrace
from tinkertrace import semconv
from tinkertrace.sdk.rollout import stable_task_id
from tinkertrace.spanstore.reader import open_spans

MESSAGES = [{"role": "user", "content": "hi"}]


def _chat(server) -> None:
    httpx.post(server.base_url + "/chat/completions", json={"model": "m", "messages": MESSAGES})


@dataclass
class Task:
    id: str
    question: str


def test_task_ids_attempts_split_and_return_value(traced) -> None:
    @tinkertrace.traced_rollout(split="eval")
    def by_field(task: Task) -> str:
        return "not a reward"

    @tinkertrace.traced_rollout(task_id_arg="key")
    def by_arg(question: str, key: str, attempt: int) -> list[int]:
        return [1]

    @tinkertrace.traced_rollout
    def by_hash(problem: dict) -> None:
        return None

    assert by_field(Task("t7", "q")) == "not a reward"
    assert by_field(Task("t7", "q")) == "not a reward"
    assert by_arg("q", key="k1", attempt=5) == [1]
    assert by_hash({"q": 1, "a": 2}) is None
    roots = traced.rows("span_type = 'rollout'")
    assert [(r["task_id"], r["attempt"], r["split"]) for r in roots] == [
        ("t7", 0, "eval"),
        ("t7", 1, "eval"),
        ("k1", 5, "train"),
        (stable_task_id({"a": 2, "q": 1}), 0, "train"),
    ]
    assert len({r["rollout_id"] for r in roots}) == 4
    assert json.loads(json.loads(roots[0]["attributes"])[semconv.TASK_INPUT]) == {"id": "t7", "question": "q"}
    assert traced.rows("span_type = 'reward'") == []  # no numeric return, no reward


def test_numeric_return_is_the_final_reward_and_rewards_are_counted(openai_server, traced) -> None:
    @tinkertrace.traced_rollout
    def agent(task: str) -> float:
        _chat(openai_server)
        assert tinkertrace.emit_reward({"correct": 1.0, "format": 0.25}, primary="format", response_id="r-1")
        return 0.75

    assert agent("q") == 0.75
    rewards = traced.rows("span_type = 'reward'")
    assert [(r["reward_name"], r["reward_value"], r["response_id"]) for r in rewards] == [
        ("format", 0.25, "r-1"),
        ("primary", 0.75, None),
    ]
    first, final = (json.loads(r["attributes"]) for r in rewards)
    assert json.loads(first[semconv.REWARD_DIMENSIONS]) == {"correct": 1.0, "format": 0.25}
    assert first[semconv.GENAI_EVALUATION_SCORE] == 0.25 and first[semconv.GENAI_EVALUATION_NAME] == "format"
    assert final[semconv.REWARD_FINAL] is True
    assert all(r["name"] == semconv.REWARD_SPAN_NAME for r in rewards)
    (root,) = traced.rows("span_type = 'rollout'")
    attrs = json.loads(root["attributes"])
    assert (attrs[semconv.ROLLOUT_LLM_CALLS], attrs[semconv.ROLLOUT_REWARDS]) == (1, 2)
    assert attrs[semconv.ROLLOUT_STATUS] == semconv.STATUS_SUCCEEDED


@pytest.mark.parametrize("final", [np.float32(0.75), np.int64(1), np.float64(0.5)])
def test_numpy_rewards_emitted_and_returned(traced, final) -> None:
    @tinkertrace.traced_rollout
    def agent(task: str) -> object:
        assert tinkertrace.emit_reward(np.float32(0.25))
        assert tinkertrace.emit_reward({"correct": np.int64(1), "format": np.float32(0.5)}, primary="format")
        return final

    assert agent("q") is final
    rewards = traced.rows("span_type = 'reward'")
    assert [(r["reward_name"], r["reward_value"]) for r in rewards] == [
        ("primary", 0.25),
        ("format", 0.5),
        ("primary", float(final)),
    ]
    assert json.loads(json.loads(rewards[1]["attributes"])[semconv.REWARD_DIMENSIONS]) == {
        "correct": 1.0,
        "format": 0.5,
    }
    assert json.loads(rewards[2]["attributes"])[semconv.REWARD_FINAL] is True


def test_exception_is_recorded_and_reraised(traced) -> None:
    @tinkertrace.traced_rollout
    async def agent(task: str) -> float:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        asyncio.run(agent("q"))
    (root,) = traced.rows("span_type = 'rollout'")
    assert root["status_code"] == "ERROR" and "boom" in root["status_message"]
    assert json.loads(root["attributes"])[semconv.ROLLOUT_STATUS] == semconv.STATUS_FAILED
    assert json.loads(root["events"])[0]["name"] == "exception"


def test_emit_reward_outside_a_rollout_or_invalid_warns(traced) -> None:
    with pytest.warns(RuntimeWarning, match="outside a @traced_rollout"):
        assert tinkertrace.emit_reward(1.0) is False

    @tinkertrace.traced_rollout
    def agent(task: str) -> None:
        with pytest.warns(RuntimeWarning, match="not finite"):
            assert tinkertrace.emit_reward(float("nan")) is False
        with pytest.warns(RuntimeWarning, match="must be a number"):
            assert tinkertrace.emit_reward("good") is False  # type: ignore[arg-type]
        with pytest.warns(RuntimeWarning, match="must be a number"):
            assert tinkertrace.emit_reward({"a": "1.0"}) is False  # a numeric string is not a number
        with pytest.warns(RuntimeWarning, match="must be a number"):
            assert tinkertrace.emit_reward(np.array([1.0, 2.0])) is False  # type: ignore[arg-type]

    agent("q")
    assert traced.rows("span_type = 'reward'") == []


def test_context_reaches_threads_executors_and_asyncio_tasks(openai_server, traced) -> None:
    @tinkertrace.traced_rollout
    def threaded(task: str) -> None:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda _: _chat(openai_server), range(2)))  # map -> submit, patched
        t = threading.Thread(target=tinkertrace.in_context(lambda: _chat(openai_server)))
        t.start()
        t.join()

    @tinkertrace.traced_rollout
    async def concurrent(task: str) -> None:
        async def call() -> None:
            async with httpx.AsyncClient() as client:
                body = {"model": "m", "messages": MESSAGES}
                await client.post(openai_server.base_url + "/chat/completions", json=body)

        loop = asyncio.get_running_loop()
        await asyncio.gather(call(), call(), loop.run_in_executor(None, _chat, openai_server))

    threaded("a")
    asyncio.run(concurrent("b"))
    roots = {r["task_id"]: r for r in traced.rows("span_type = 'rollout'")}
    llm = traced.rows("span_type = 'llm'")
    assert sorted(r["task_id"] for r in llm) == ["a", "a", "a", "b", "b", "b"]
    for row in llm:
        root = roots[row["task_id"]]
        assert row["rollout_id"] == root["rollout_id"] and row["trace_id"] == root["trace_id"]
    for root in roots.values():
        assert json.loads(root["attributes"])[semconv.ROLLOUT_LLM_CALLS] == 3


def test_agent_span_names_llm_calls(openai_server, traced) -> None:
    @tinkertrace.agent_span("critic")
    def critic() -> None:
        _chat(openai_server)

    @tinkertrace.traced_rollout
    def agent(task: str) -> None:
        with tinkertrace.agent_span("solver"):
            _chat(openai_server)
        critic()

    agent("q")
    llm = traced.rows("span_type = 'llm'")
    agents = traced.rows("span_type = 'agent'")
    assert [r["agent_name"] for r in llm] == ["solver", "critic"]
    assert [a["name"] for a in agents] == ["invoke_agent solver", "invoke_agent critic"]
    assert [r["parent_span_id"] for r in llm] == [a["span_id"] for a in agents]
    (root,) = traced.rows("span_type = 'rollout'")
    assert json.loads(root["attributes"])[semconv.ROLLOUT_AGENT_SPANS] == 2


def test_coexists_with_the_applications_tracer_provider(openai_server, traced) -> None:
    app_exporter = InMemorySpanExporter()
    app_provider = TracerProvider()
    app_provider.add_span_processor(SimpleSpanProcessor(app_exporter))
    app_tracer = app_provider.get_tracer("app")

    @tinkertrace.traced_rollout
    def agent(task: str) -> None:
        with app_tracer.start_as_current_span("app work"):
            _chat(openai_server)

    with app_tracer.start_as_current_span("request"):
        agent("q")
    assert [s.name for s in app_exporter.get_finished_spans()] == ["app work", "request"]
    (root,) = traced.rows("span_type = 'rollout'")
    (llm,) = traced.rows("span_type = 'llm'")
    app_work = app_exporter.get_finished_spans()[0]
    assert app_work.parent.span_id == int(root["span_id"], 16)  # the app's span nests in the rollout
    assert llm["parent_span_id"] == f"{app_work.context.span_id:016x}"
    assert llm["rollout_id"] == root["rollout_id"]


def _count(folder) -> int:
    con = duckdb.connect()
    open_spans(con, folder)
    return con.sql("select count(*) from spans").fetchall()[0][0]


def test_reinit_replaces_config_and_env_vars_configure(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TINKERTRACE_SPANS_DIR", str(tmp_path / "env-spans"))
    monkeypatch.setenv("TINKERTRACE_SERVICE_NAME", "my-agent")
    monkeypatch.setenv("TINKERTRACE_CAPTURE_CONTENT", "0")
    try:
        config = tinkertrace.init()
        assert config.spans_dir == tmp_path / "env-spans" and config.capture_content is False

        @tinkertrace.traced_rollout
        def agent(task: str) -> float:
            return 1.0

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            agent("q")
        tinkertrace.init(spans_dir=tmp_path / "other")
        agent("q")
    finally:
        tinkertrace.shutdown()
    assert (_count(tmp_path / "env-spans"), _count(tmp_path / "other")) == (2, 2)  # rollout + final reward
    con = duckdb.connect()
    open_spans(con, tmp_path / "env-spans")
    assert con.sql("select distinct service_name from spans").fetchall() == [("my-agent",)]
    monkeypatch.setenv("TINKERTRACE_PROTOCOL", "carrier-pigeon")
    with pytest.raises(ValueError, match="carrier-pigeon"):
        tinkertrace.init()


def test_auto_init_on_first_use_defaults_to_a_spans_folder(tmp_path, monkeypatch) -> None:
    for var in ("TINKERTRACE_SPANS_DIR", "TINKERTRACE_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    tinkertrace.shutdown()

    @tinkertrace.traced_rollout
    def agent(task: str) -> float:
        return 0.5

    try:
        agent("q")
    finally:
        tinkertrace.shutdown()
    assert _count(tmp_path / "spans") == 2


def test_queue_overflow_is_counted_and_warned(trace_init, caplog) -> None:
    traced = trace_init(max_queue_spans=3, batch_size=1000, schedule_delay_s=60)

    @tinkertrace.traced_rollout
    def agent(task: int) -> float:
        return 1.0

    for i in range(4):  # 8 spans into a queue of 3, nothing exported in between
        agent(i)
    stats = tinkertrace.stats()
    assert (stats["spans_queued"], stats["spans_dropped"]) == (3, 5)
    assert "spans are being dropped" in caplog.text
    assert len(traced.rows()) == 3


def test_otel_sdk_disabled_keeps_training_data(openai_server, trace_init, monkeypatch, caplog) -> None:
    """``OTEL_SDK_DISABLED=true`` (CrewAI's advice) turns OTel telemetry off, not tinkertrace's data:
    root, agent, LLM and reward spans are all written, and a warning says so."""
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    traced = trace_init()
    assert "keeps recording training data" in caplog.text

    @tinkertrace.traced_rollout
    def agent(task: str) -> float:
        with tinkertrace.agent_span("solver"):
            _chat(openai_server)
        return 1.0

    agent("q")
    types = sorted(r["span_type"] for r in traced.rows())
    assert types == ["agent", "llm", "reward", "rollout"]
    (root,) = traced.rows("span_type = 'rollout'")
    assert all(r["rollout_id"] == root["rollout_id"] for r in traced.rows())
    assert TracerProvider().get_tracer("app").__class__.__name__ == "NoOpTracer"  # OTel's own switch holds
