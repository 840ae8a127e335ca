"""The endpoint records what it serves: the real OpenAI client calls the endpoint, the real collector
(a subprocess on a loopback port) stores the spans, and today's builder makes triplets of them.

Rollouts are named three ways (URL prefix, headers, W3C traceparent); rewards and rollout ends are
posted over HTTP. The scripted sampler replies with known texts; its token ids are the tokenizer's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import duckdb
import httpx
import openai
import pytest

from tinkertrace import semconv
from tinkertrace.builder.build import build_trajectories
from tinkertrace.collector.launch import running_collector
from tinkertrace.netutil import BackgroundServer, free_port
from tinkertrace.serving.policy import PolicyHolder
from tinkertrace.serving.recording import CallRecorder
from tinkertrace.spanstore.reader import open_spans

MODEL = "scripted-model"
ROLLOUT_ATTRS = (semconv.ROLLOUT_STATUS, semconv.ROLLOUT_LLM_CALLS, semconv.ROLLOUT_REWARDS)


def _collector_on(out: Path, port: int) -> AbstractContextManager[str]:
    """A real collector process on ``port`` writing to ``out``, stopped on exit: its URL."""
    return running_collector(out, port, "--no-grpc", "--roll-seconds", "0.2")


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A real collector writing to ``tmp_path/spans``: ``(OTLP URL, spans folder)``."""
    with _collector_on(tmp_path / "spans", free_port()) as url:
        yield url, tmp_path / "spans"


def _query(spans: Path, sql: str) -> list[tuple]:
    con = duckdb.connect()
    open_spans(con, spans)
    return con.execute(sql).fetchall()


def _wait_rows(spans: Path, sql: str, expected: int, timeout: float = 30.0) -> list[tuple]:
    """Poll the collector's Parquet until ``sql`` returns ``expected`` rows."""
    deadline, rows = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        if any(spans.rglob("*.parquet")):
            rows = _query(spans, sql)
            if len(rows) == expected:
                return rows
        time.sleep(0.2)
    raise AssertionError(f"expected {expected} rows of {sql!r}, got {rows}")


@pytest.fixture
def recorded_server(  # the collector first: it stops after the servers, which flush to it
    collector: tuple[str, Path], tokenizer: Any, scripted: Any, start_server: Callable[..., BackgroundServer]
) -> Callable[..., tuple[BackgroundServer, CallRecorder]]:
    def start(replies: list[str], **options: Any) -> tuple[BackgroundServer, CallRecorder]:
        recorder = CallRecorder(collector=collector[0], spool_dir=collector[1].parent / "spool")
        policy = PolicyHolder(scripted(replies), tokenizer, MODEL, version=3)
        return start_server(policy, recorder=recorder, **options), recorder

    return start


def test_url_prefix_rollout_reward_and_finish_build_one_trajectory(
    recorded_server: Callable[..., tuple[BackgroundServer, CallRecorder]], collector: tuple[str, Path]
) -> None:
    server, recorder = recorded_server(["first answer", "second answer"])
    base = f"{server.url}/rollouts/r-1/task/t-7/agent/solver/v1"
    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0)
    first = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    turn_two = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "again"},
    ]
    chunks = list(client.chat.completions.create(model=MODEL, messages=turn_two, stream=True, max_tokens=40))
    streamed_id = chunks[0].id
    reward = httpx.post(
        f"{server.url}/v1/rollouts/r-1/reward", json={"value": 0.75, "response_id": first.id}, timeout=10
    )
    assert reward.status_code == 200, reward.text
    assert reward.json()["rewards"] == 1
    done = httpx.post(f"{server.url}/v1/rollouts/r-1/finish", json={"status": "succeeded"}, timeout=10)
    assert done.json() == {"rollout_id": "r-1", "status": "succeeded", "llm_calls": 2, "rewards": 1}
    assert recorder.flush(30)

    spans = collector[1]
    rows = _wait_rows(
        spans,
        "SELECT span_type, rollout_id, task_id, agent_name, response_id, prompt_token_ids, "
        "response_token_ids, len(response_logprobs), policy_version, "
        f"json_extract_string(attributes, '$.\"{semconv.LLM_CAPTURE_SIDE}\"') "
        "FROM spans WHERE span_type = 'llm' ORDER BY start_time",
        2,
    )
    served = first.model_extra or {}
    assert rows[0][1:5] == ("r-1", "t-7", "solver", first.id)
    assert rows[0][5] == served["prompt_token_ids"]
    assert rows[0][6] == first.choices[0].model_extra["token_ids"]
    assert rows[0][7] == len(rows[0][6])  # logprobs recorded though the agent did not ask for them
    assert rows[0][8] == 3 and rows[0][9] == semconv.CAPTURE_SERVER
    assert rows[1][4] == streamed_id and rows[1][9] == semconv.CAPTURE_SERVER
    extras = [ch.model_extra or {} for c in chunks for ch in c.choices]
    streamed_ids = [i for extra in extras for i in extra.get("token_ids") or []]
    assert rows[1][6] == streamed_ids
    _wait_rows(spans, "SELECT 1 FROM spans WHERE span_type IN ('rollout', 'reward')", 2)

    result = build_trajectories(spans)
    triplets = result.triplets.to_pylist()
    assert [(t["rollout_id"], t["task_id"], t["response_id"]) for t in triplets] == [
        ("r-1", "t-7", first.id),
        ("r-1", "t-7", streamed_id),
    ]
    columns = ["rollout_id", "agent_name", "reward", "tokens", "num_turns"]
    [trajectory] = result.trajectories.select(columns).to_pylist()  # the second turn extends the first
    assert trajectory["num_turns"] == 2
    assert trajectory["rollout_id"] == "r-1" and trajectory["agent_name"] == "solver"
    assert trajectory["reward"] == pytest.approx(0.75)
    assert trajectory["tokens"][: len(served["prompt_token_ids"])] == served["prompt_token_ids"]


def test_headers_and_traceparent_make_the_server_span_a_child_of_the_callers(
    recorded_server: Callable[..., tuple[BackgroundServer, CallRecorder]], collector: tuple[str, Path]
) -> None:
    server, recorder = recorded_server(["a reply"])
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    client = openai.OpenAI(
        base_url=server.url + "/v1",
        api_key="unused",
        max_retries=0,
        default_headers={
            "traceparent": f"00-{trace_id}-{parent_id}-01",
            semconv.HEADER_ROLLOUT_ID: "r-h",
            "x-tinkertrace-task-id": "t-h",
            "x-tinkertrace-attempt": "2",
        },
    )
    reply = client.completions.create(model=MODEL, prompt="say", max_tokens=8)
    assert recorder.flush(30)
    [row] = _wait_rows(
        collector[1],
        "SELECT trace_id, parent_span_id, rollout_id, task_id, attempt, response_id FROM spans "
        "WHERE span_type = 'llm'",
        1,
    )
    assert row == (trace_id, parent_id, "r-h", "t-h", 2, reply.id)


def test_rollout_routes_need_the_api_key_and_reject_bad_bodies(
    recorded_server: Callable[..., tuple[BackgroundServer, CallRecorder]],
) -> None:
    server, recorder = recorded_server(["x"], api_key="secret")
    client = openai.OpenAI(base_url=f"{server.url}/rollouts/r-k/v1", api_key="secret", max_retries=0)
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    url, auth = f"{server.url}/v1/rollouts/r-k", {"Authorization": "Bearer secret"}

    assert httpx.post(f"{url}/reward", json={"value": 1.0}, timeout=10).status_code == 401
    wrong = httpx.post(f"{url}/reward", json={"value": 1.0}, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    for bad in ({}, {"value": "high"}, {"value": True}, {"value": float("inf")}, {"value": 1, "name": 3}, []):
        answer = httpx.post(f"{url}/reward", content=_json(bad), headers=auth, timeout=10)
        assert answer.status_code == 400, (bad, answer.text)
        assert answer.json()["error"]["message"]
    assert httpx.post(f"{url}/reward", content=b"{not json", headers=auth).status_code == 400
    assert httpx.post(f"{url}/finish", json={"status": "maybe"}, headers=auth).status_code == 400
    unknown = httpx.post(f"{server.url}/v1/rollouts/never/reward", json={"value": 1}, headers=auth)
    assert unknown.status_code == 404 and "never" in unknown.json()["error"]["message"]

    two = httpx.post(f"{url}/reward", json={"value": {"ok": 1, "style": 0.5}}, headers=auth)
    assert two.status_code == 200
    assert httpx.post(f"{url}/finish", json={}, headers=auth).json()["rewards"] == 1
    again = httpx.post(f"{url}/finish", json={}, headers=auth)
    assert again.status_code == 409
    # a bad identity header is a clear 400, and the server keeps serving
    with pytest.raises(openai.BadRequestError, match="attempt"):
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"x-tinkertrace-attempt": "x"},
        )
    assert recorder.stats()["calls_recorded"] == 1


def _json(value: Any) -> bytes:
    import json

    return json.dumps(value).encode()


def test_a_call_seen_by_the_sdk_and_the_endpoint_carries_one_identity(
    recorded_server: Callable[..., tuple[BackgroundServer, CallRecorder]],
    collector: tuple[str, Path],
    tmp_path: Path,
) -> None:
    """The SDK sends the task, attempt and agent beside the rollout id: the endpoint's span of a call
    and the SDK's span of the same call name the same rollout, task, attempt, agent and response."""
    import tinkertrace

    server, recorder = recorded_server(["client and server"])
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)

    @tinkertrace.traced_rollout
    def solve(task: dict, attempt: int) -> float:
        with tinkertrace.agent_span("solver"):
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": task["q"]}])
        return 1.0

    tinkertrace.init(spans_dir=tmp_path / "client", schedule_delay_s=0.05)
    try:
        solve({"id": "task-9", "q": "hi"}, attempt=3)
        assert tinkertrace.flush(30)
    finally:
        tinkertrace.shutdown()
    assert recorder.flush(30)
    columns = (
        "rollout_id, task_id, attempt, agent_name, response_id, response_token_ids, response_logprobs, "
        f"json_extract_string(attributes, '$.\"{semconv.LLM_CAPTURE_SIDE}\"')"
    )
    [sdk] = _query(tmp_path / "client", f"SELECT {columns} FROM spans WHERE span_type = 'llm'")
    [served] = _wait_rows(collector[1], f"SELECT {columns} FROM spans WHERE span_type = 'llm'", 1)
    assert sdk[:7] == served[:7] and sdk[1:4] == ("task-9", 3, "solver")
    assert served[7] == semconv.CAPTURE_SERVER and sdk[7] != semconv.CAPTURE_SERVER


def test_calls_recorded_while_the_collector_is_down_arrive_once_it_is_back(
    tokenizer: Any, scripted: Any, start_server: Callable[..., BackgroundServer], tmp_path: Path
) -> None:
    """The SDK's durability: spooled while nothing listens, kept across an endpoint restart, re-sent."""
    port, spool, out = free_port(), tmp_path / "spool", tmp_path / "spans"
    url = f"http://127.0.0.1:{port}"
    recorder = CallRecorder(collector=url, spool_dir=spool, retry_interval_s=0.2, export_timeout_s=1.0)
    server = start_server(PolicyHolder(scripted(["while down"]), tokenizer, MODEL), recorder=recorder)
    client = openai.OpenAI(base_url=f"{server.url}/rollouts/r-down/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert httpx.post(f"{server.url}/v1/rollouts/r-down/finish", timeout=10).status_code == 200
    assert not recorder.close(timeout_s=2.0)  # nothing listens: the spans wait in the spool
    assert recorder.stats()["spans_spooled"] == 2
    server.stop()  # the endpoint goes away; its spool stays on disk

    with _collector_on(out, port):
        restarted = CallRecorder(collector=url, spool_dir=spool, retry_interval_s=0.2)
        assert restarted.flush(30)  # the next endpoint on this spool re-sends it
        restarted.close()
        rows = _wait_rows(out, "SELECT span_type, response_id FROM spans ORDER BY span_type", 2)
    assert rows == [("llm", reply.id), ("rollout", None)]


def test_an_idle_rollout_is_closed_as_timed_out_and_written(
    tokenizer: Any, scripted: Any, start_server: Callable[..., BackgroundServer], tmp_path: Path
) -> None:
    """A rollout nobody finishes is not silently lost: after its idle time the endpoint writes its
    rollout span, status timed_out, with its counts; later rewards get 409 naming that status."""
    recorder = CallRecorder(spans_dir=tmp_path / "spans", rollout_idle_s=0.5)
    server = start_server(PolicyHolder(scripted(["a", "b"]), tokenizer, MODEL), recorder=recorder)
    client = openai.OpenAI(base_url=f"{server.url}/rollouts/idle/v1", api_key="x", max_retries=0)
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert httpx.post(f"{server.url}/v1/rollouts/idle/reward", json={"value": 1}).status_code == 200
    deadline = time.monotonic() + 20
    while recorder.stats()["rollouts_timed_out"] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert recorder.stats()["open_rollouts"] == 0
    late = httpx.post(f"{server.url}/v1/rollouts/idle/reward", json={"value": 1})
    assert late.status_code == 409 and "timed_out" in late.json()["error"]["message"]
    assert recorder.flush()
    rows = _query(
        tmp_path / "spans",
        "SELECT "
        + ", ".join(f"json_extract_string(attributes, '$.\"{name}\"')" for name in ROLLOUT_ATTRS)
        + " FROM spans WHERE span_type = 'rollout'",
    )
    assert rows == [("timed_out", "1", "1")]


def test_a_call_seen_by_the_sdk_and_by_the_endpoint_builds_one_triplet(
    tokenizer: Any, scripted: Any, start_server: Callable[..., BackgroundServer], tmp_path: Path
) -> None:
    """A traced agent (client-side capture) calls a recording endpoint (server-side capture), both
    writing to one spans folder: every call is stored twice and built once, in the SDK's rollout."""
    import tinkertrace

    spans = tmp_path / "spans"
    recorder = CallRecorder(spans_dir=spans)
    server = start_server(PolicyHolder(scripted(["first", "second"]), tokenizer, MODEL), recorder=recorder)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    tinkertrace.init(spans_dir=spans)
    seen: list[str] = []

    @tinkertrace.traced_rollout
    def agent(task: dict) -> float:
        turns = [{"role": "user", "content": "hi"}]
        first = client.chat.completions.create(model=MODEL, messages=turns)
        turns += [{"role": "assistant", "content": first.choices[0].message.content or ""}]
        second = client.chat.completions.create(
            model=MODEL, messages=[*turns, {"role": "user", "content": "?"}]
        )
        seen.extend([first.id, second.id])
        return 1.0

    try:
        agent({"id": "t-both"})
        assert tinkertrace.flush()
    finally:
        tinkertrace.shutdown()
    assert recorder.close(30)
    side = f"coalesce(json_extract_string(attributes, '$.\"{semconv.LLM_CAPTURE_SIDE}\"'), 'client')"
    stored = _query(
        spans, f"SELECT {side}, count(*) FROM spans WHERE span_type = 'llm' GROUP BY 1 ORDER BY 1"
    )
    assert stored == [(semconv.CAPTURE_CLIENT, 2), (semconv.CAPTURE_SERVER, 2)]

    result = build_trajectories(spans)
    triplets = result.triplets.select(["response_id", "task_id"]).to_pylist()
    assert [t["response_id"] for t in triplets] == seen
    assert {t["task_id"] for t in triplets} == {"t-both"}
    [trajectory] = result.trajectories.select(["num_turns", "reward"]).to_pylist()
    assert trajectory["num_turns"] == 2 and trajectory["reward"] == pytest.approx(1.0)
