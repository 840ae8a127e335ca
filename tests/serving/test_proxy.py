"""`tinkertrace proxy`: the real OpenAI client → the proxy → an upstream (the vLLM-shaped test server,
or our own endpoint), every call recorded as a server-side span, the answer passed on unchanged.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import duckdb
import httpx
import openai
import pytest
from typer.testing import CliRunner

from tinkertrace import semconv
from tinkertrace.cli.main import app
from tinkertrace.netutil import BackgroundServer, free_port, wait_for_port
from tinkertrace.serving.admission import Demand
from tinkertrace.serving.policy import PolicyHolder
from tinkertrace.serving.proxy import create_proxy_app
from tinkertrace.serving.recording import CallRecorder
from tinkertrace.spanstore.reader import open_spans

SIDE = f"json_extract_string(attributes, '$.\"{semconv.LLM_CAPTURE_SIDE}\"')"
INJECTED = f"json_extract_string(attributes, '$.\"{semconv.LLM_INJECTED}\"')"


@pytest.fixture
def proxy_to(tmp_path: Path) -> Iterator[Any]:
    """``proxy_to(upstream, **options)``: a recording proxy on a free port → ``(server, recorder)``."""
    started: list[BackgroundServer] = []

    def start(upstream: str, **options: Any) -> tuple[BackgroundServer, CallRecorder]:
        journal = tmp_path / "spans" / "_journal" / f"proxy-{len(started)}"  # one per proxy
        recorder = CallRecorder(spans_dir=tmp_path / "spans", journal_dir=journal)
        server = BackgroundServer(create_proxy_app(upstream, recorder=recorder, **options)).start()
        started.append(server)
        return server, recorder

    yield start
    for server in started:
        server.stop()


def _llm_spans(tmp_path: Path, columns: str) -> list[tuple]:
    con = duckdb.connect()
    open_spans(con, tmp_path / "spans")
    return con.execute(f"SELECT {columns} FROM spans WHERE span_type = 'llm' ORDER BY start_time").fetchall()


def test_calls_pass_through_unchanged_and_are_recorded_token_exact(openai_server, proxy_to, tmp_path) -> None:
    openai_server.options.policy_version = 5
    proxy, recorder = proxy_to(openai_server.base_url)
    client = openai.OpenAI(base_url=f"{proxy.url}/rollouts/r-p/task/t-p/v1", api_key="k", max_retries=0)
    direct = openai.OpenAI(base_url=openai_server.base_url, api_key="k", max_retries=0)
    messages = [{"role": "user", "content": "hello proxy"}]
    ask_ids = {"return_token_ids": True, "logprobs": True}

    chat = client.chat.completions.create(model="test-model", messages=messages)
    reference = direct.chat.completions.create(model="test-model", messages=messages, extra_body=ask_ids)
    assert chat.choices[0].message.content == reference.choices[0].message.content
    assert chat.choices[0].model_extra["token_ids"] == reference.choices[0].model_extra["token_ids"]
    sent = openai_server.requests[0]  # what the proxy sent upstream: the ids and logprobs asked for
    assert sent["return_token_ids"] is True and sent["logprobs"] is True

    chunks = list(client.chat.completions.create(model="test-model", messages=messages, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == chat.choices[0].message.content
    completion = client.completions.create(model="test-model", prompt="abc", max_tokens=5)
    response = client.responses.create(model="test-model", input="hi there")
    assert recorder.flush(30)

    rows = _llm_spans(
        tmp_path,
        f"response_id, rollout_id, task_id, response_token_ids, len(response_logprobs), token_source, "
        f"policy_version, {SIDE}, {INJECTED}",
    )
    assert [r[0] for r in rows] == [chat.id, chunks[0].id, completion.id, response.id]
    assert all(r[1:3] == ("r-p", "t-p") for r in rows)
    assert rows[0][3] == chat.choices[0].model_extra["token_ids"]
    ids = [i for c in chunks for ch in c.choices for i in (ch.model_extra or {}).get("token_ids") or []]
    assert rows[1][3] == ids
    assert rows[3][3] == response.model_extra["output_token_ids"]
    for row in rows:
        assert row[4] == len(row[3]) > 0
        assert row[5:8] == (semconv.SOURCE_SERVER, 5, semconv.CAPTURE_SERVER)
        assert "return_token_ids" in json.loads(row[8])


def test_an_upstream_refusing_the_added_fields_gets_the_agents_body(
    openai_server, proxy_to, tmp_path
) -> None:
    openai_server.options.reject_fields = ("return_token_ids",)
    openai_server.options.token_ids = False
    proxy, recorder = proxy_to(openai_server.base_url)
    client = openai.OpenAI(base_url=f"{proxy.url}/rollouts/r-x/v1", api_key="k", max_retries=0)
    reply = client.chat.completions.create(model="test-model", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content
    assert [("return_token_ids" in r) for r in openai_server.requests] == [True, False]
    assert recorder.flush(30)
    [(source, ids, injected)] = _llm_spans(tmp_path, f"token_source, response_token_ids, {INJECTED}")
    assert source == semconv.SOURCE_NONE and not ids  # marked: no ids from this upstream
    assert json.loads(injected) == []


def test_upstream_errors_reach_the_agent_and_a_dead_upstream_is_a_502(openai_server, proxy_to) -> None:
    openai_server.options.fail_status, openai_server.options.fail_times = 503, 1
    proxy, _ = proxy_to(openai_server.base_url)
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.InternalServerError) as failed:
        client.chat.completions.create(model="test-model", messages=[{"role": "user", "content": "hi"}])
    assert failed.value.status_code == 503
    dead, _ = proxy_to("http://127.0.0.1:9/v1")
    answer = httpx.post(f"{dead.url}/v1/chat/completions", json={"model": "m", "messages": []}, timeout=30)
    assert answer.status_code == 502 and "did not answer" in answer.json()["error"]["message"]


def test_harness_probes_are_answered_by_the_proxy_as_by_serve(openai_server, proxy_to) -> None:
    """Claude Code sends ``HEAD /api/hello`` to its base URL (the proxy, under a rollout prefix or not)
    before its first call: answered 200 as the real service and ``serve`` answer it, not a 404."""
    proxy, _ = proxy_to(openai_server.base_url)
    for path in ("/", "/api/hello", "/rollouts/r-1/task/t-1/api/hello"):
        assert httpx.head(f"{proxy.url}{path}", timeout=10).status_code == 200, path
        assert httpx.get(f"{proxy.url}{path}", timeout=10).json() == {"status": "ok"}, path
    assert httpx.post(f"{proxy.url}/rollouts/r-1/chat/completions", json={}, timeout=10).status_code == 404


def test_admission_works_through_the_proxy_in_front_of_the_endpoint(
    scripted: Any, tokenizer: Any, start_server: Any, proxy_to: Any, tmp_path: Path
) -> None:
    policy = PolicyHolder(scripted(["one reply", "two"]), tokenizer, "scripted-model", version=2)
    endpoint = start_server(policy)
    policy.admission.set_demand(Demand(rollouts_per_step=1, max_staleness=0))  # capacity: one open rollout
    proxy, recorder = proxy_to(endpoint.url + "/v1")

    def call(rollout: str) -> float:
        client = openai.OpenAI(base_url=f"{proxy.url}/rollouts/{rollout}/v1", api_key="k", max_retries=0)
        started = time.monotonic()
        client.chat.completions.create(model="scripted-model", messages=[{"role": "user", "content": "hi"}])
        return time.monotonic() - started

    call("a")
    with ThreadPoolExecutor(1) as pool:
        second = pool.submit(call, "b")
        deadline = time.monotonic() + 10
        while policy.admission.stats()["waiting"] != 1:  # rollout b is held at the endpoint
            assert time.monotonic() < deadline, policy.admission.stats()
            time.sleep(0.02)
        policy.admission.consume(["a"])
        second.result(timeout=10)
    stats = policy.admission.stats()
    assert stats["admitted"] == 2 and stats["held"] == 1
    assert recorder.flush(30)
    rows = _llm_spans(tmp_path, "rollout_id, policy_version, len(response_token_ids)")
    assert [(r[0], r[1]) for r in rows] == [("a", 2), ("b", 2)] and all(r[2] > 0 for r in rows)


def test_proxy_command_records_and_flushes_at_shutdown(openai_server, tmp_path: Path) -> None:
    port, spans = free_port(), tmp_path / "cli-spans"
    cmd = [sys.executable, "-m", "tinkertrace.cli.main", "proxy", "--upstream", openai_server.base_url]
    cmd += ["--port", str(port), "--spans-dir", str(spans), "--api-key", "pk", "--max-request-mb", "0.01"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port(port, timeout=60)
        base = f"http://127.0.0.1:{port}/rollouts/r-cli/v1"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).models.list()
        client = openai.OpenAI(base_url=base, api_key="pk", max_retries=0)
        reply = client.chat.completions.create(
            model="test-model", messages=[{"role": "user", "content": "x"}]
        )
        finish = httpx.post(
            f"http://127.0.0.1:{port}/v1/rollouts/r-cli/finish", headers={"Authorization": "Bearer pk"}
        )
        assert finish.json()["llm_calls"] == 1
        too_big = httpx.post(f"{base}/chat/completions", content=b"x" * 20_000, headers={"x-api-key": "pk"})
        assert too_big.status_code == 413 and "0.01 MiB" in too_big.json()["error"]["message"]
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode in (0, -signal.SIGTERM), stderr  # uvicorn re-raises the signal it handled
    assert f"http://127.0.0.1:{port}/v1" in stderr and "recording calls to" in stderr
    con = duckdb.connect()
    open_spans(con, spans)  # written at shutdown (the roll is 5 s): nothing left behind
    rows = con.execute("SELECT span_type, rollout_id, response_id FROM spans ORDER BY span_type").fetchall()
    assert rows == [("llm", "r-cli", reply.id), ("rollout", "r-cli", None)]


def test_proxy_command_refuses_to_run_without_a_recording_target() -> None:
    result = CliRunner().invoke(app, ["proxy", "--upstream", "http://127.0.0.1:9/v1"])
    assert result.exit_code != 0 and "--spans-dir" in result.output
    result = CliRunner().invoke(app, ["proxy", "--upstream", "localhost:9", "--spans-dir", "x"])
    assert result.exit_code != 0 and "http(s) URL" in result.output
