"""Plain httpx (sync and async) capture, injection fallbacks and the re-tokenisation path."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

import tinkertrace
from tinkertrace import semconv
from tinkertrace.models.tokenizer import BUILTIN_MODEL, load_tokenizer
from tinkertrace.testing.openai_server import byte_logprob, render_chat

MESSAGES = [{"role": "user", "content": "hi"}]
REPLY = "echo: hi"


def test_httpx_sync_streaming_reaches_agent_unchanged(openai_server, traced) -> None:
    body = {"model": "m", "messages": MESSAGES, "stream": True}

    @tinkertrace.traced_rollout
    def agent(task: str) -> list[bytes]:
        with (
            httpx.Client() as client,
            client.stream("POST", openai_server.base_url + "/chat/completions", json=body) as r,
        ):
            return list(r.iter_raw())

    chunks = agent("q")
    raw = b"".join(chunks)
    events = [line for line in raw.split(b"\n\n") if line]
    assert events[-1] == b"data: [DONE]"
    assert len(events) == 1 + len(REPLY) + 1 + 1  # role chunk, one per character, finish chunk, DONE
    (row,) = traced.rows("span_type = 'llm'")
    assert row["response_token_ids"] == list(REPLY.encode())
    assert row["prompt_token_ids"] == list(render_chat(MESSAGES).encode())


def test_httpx_async_non_streaming(openai_server, traced) -> None:
    @tinkertrace.traced_rollout
    async def agent(task: str) -> dict:
        async with httpx.AsyncClient() as client:
            r = await client.post(
                openai_server.base_url + "/completions", json={"model": "m", "prompt": "hi", "logprobs": 2}
            )
            return r.json()

    payload = asyncio.run(agent("q"))
    assert payload["choices"][0]["text"] == REPLY
    assert len(payload["choices"][0]["logprobs"]["top_logprobs"][0]) == 2  # the agent's own logprobs=2 kept
    (row,) = traced.rows("span_type = 'llm'")
    assert row["response_logprobs"] == [byte_logprob(t) for t in REPLY.encode()]
    assert row["prompt_token_ids"] == list(b"hi")


def test_server_without_ids_and_no_tokenizer_says_so(openai_server, traced) -> None:
    openai_server.options.token_ids = False

    @tinkertrace.traced_rollout
    def agent(task: str) -> None:
        httpx.post(openai_server.base_url + "/chat/completions", json={"model": "m", "messages": MESSAGES})

    agent("q")
    (row,) = traced.rows("span_type = 'llm'")
    assert row["token_source"] == semconv.SOURCE_NONE
    assert row["prompt_token_ids"] is None and row["response_token_ids"] is None


def test_retokenized_with_configured_tokenizer(openai_server, trace_init) -> None:
    openai_server.options.token_ids = False
    traced = trace_init(tokenizer=BUILTIN_MODEL)

    @tinkertrace.traced_rollout
    def agent(task: str) -> None:
        httpx.post(openai_server.base_url + "/chat/completions", json={"model": "m", "messages": MESSAGES})

    agent("q")
    (row,) = traced.rows("span_type = 'llm'")
    tok = load_tokenizer(BUILTIN_MODEL)
    expected_prompt = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)[
        "input_ids"
    ]
    assert row["token_source"] == semconv.SOURCE_RETOKENIZED
    assert row["prompt_token_ids"] == list(expected_prompt)
    assert row["response_token_ids"] == tok.encode(REPLY, add_special_tokens=False)
    # the byte-level tokenizer gives one id per byte, so the server's logprobs line up
    assert row["response_logprobs"] == [byte_logprob(t) for t in REPLY.encode()]


def test_injection_refused_is_retried_without_it(openai_server, traced) -> None:
    openai_server.options.reject_fields = ("return_token_ids",)  # a strict server, like api.openai.com

    @tinkertrace.traced_rollout
    def agent(task: str) -> list[str]:
        out = []
        for _ in range(2):
            r = httpx.post(
                openai_server.base_url + "/chat/completions", json={"model": "m", "messages": MESSAGES}
            )
            out.append(r.json()["choices"][0]["message"]["content"])
        return out

    assert agent("q") == [REPLY, REPLY]
    # first call: extended (400), then re-sent as the agent wrote it; second call: not extended
    assert ["return_token_ids" in body for body in openai_server.requests] == [True, False, False]
    rows = traced.rows("span_type = 'llm'")
    assert len(rows) == 2 and all(r["token_source"] == semconv.SOURCE_NONE for r in rows)
    assert all(r["status_code"] != "ERROR" for r in rows)
    assert json.loads(rows[0]["events"])[0]["name"] == "tinkertrace.injection_refused"


@pytest.mark.parametrize("capture_content", [True, False])
def test_content_capture_switch_and_redaction(openai_server, trace_init, capture_content: bool) -> None:
    def redact(messages: list[dict]) -> list[dict]:
        return [{**m, "content": "[redacted]"} for m in messages]

    traced = trace_init(capture_content=capture_content, redact=redact, request_token_ids=False)

    @tinkertrace.traced_rollout
    def agent(task: str) -> None:
        httpx.post(openai_server.base_url + "/chat/completions", json={"model": "m", "messages": MESSAGES})

    agent("q")
    assert "return_token_ids" not in openai_server.requests[-1]
    (row,) = traced.rows("span_type = 'llm'")
    attrs = json.loads(row["attributes"])
    if capture_content:
        assert json.loads(attrs[semconv.GENAI_INPUT_MESSAGES]) == [{"role": "user", "content": "[redacted]"}]
        assert json.loads(attrs[semconv.GENAI_OUTPUT_MESSAGES])[0]["content"] == "[redacted]"
    else:
        assert semconv.GENAI_INPUT_MESSAGES not in attrs and semconv.GENAI_OUTPUT_MESSAGES not in attrs


def test_failed_calls_give_error_spans_in_the_rollout(openai_server, traced) -> None:
    """An HTTP error and a refused connection each end as an ERROR span (built on the export thread)
    with the rollout's ids and parent; the agent sees its own outcome unchanged."""
    from tinkertrace.netutil import free_port

    openai_server.options.fail_status, openai_server.options.fail_times = 503, 1
    dead = f"http://127.0.0.1:{free_port()}/v1/chat/completions"
    body = {"model": "m", "messages": MESSAGES}

    @tinkertrace.traced_rollout
    def agent(task: str) -> tuple[int, str]:
        status = httpx.post(openai_server.base_url + "/chat/completions", json=body).status_code
        try:
            httpx.post(dead, json=body)
        except httpx.ConnectError as exc:
            return status, type(exc).__name__
        return status, "connected"

    assert agent("q") == (503, "ConnectError")
    (root,) = traced.rows("span_type = 'rollout'")
    http_error, refused = traced.rows("span_type = 'llm'")
    for row in (http_error, refused):
        assert row["status_code"] == "ERROR" and row["kind"] == "CLIENT"
        assert (row["rollout_id"], row["parent_span_id"]) == (root["rollout_id"], root["span_id"])
        assert row["trace_id"] == root["trace_id"] and row["name"] == "chat m"
        assert row["start_time"] <= row["end_time"]
    assert "HTTP 503" in http_error["status_message"]
    assert json.loads(http_error["attributes"])["error.type"] == "503"
    (event,) = json.loads(refused["events"])
    assert event["name"] == "exception"
    assert event["attributes"]["exception.type"] == "httpx.ConnectError"
    assert json.loads(refused["attributes"])["error.type"] == "ConnectError"
    assert json.loads(root["attributes"])[semconv.ROLLOUT_LLM_CALLS] == 2


def test_genuine_400_does_not_turn_ids_off(openai_server, traced) -> None:
    """A context-length 400 fails with and without the added fields: the host is not marked and the
    next call still gets server ids."""
    openai_server.options.max_context_tokens = 40
    url = openai_server.base_url + "/chat/completions"

    @tinkertrace.traced_rollout
    def agent(task: str) -> list[int]:
        too_long = [{"role": "user", "content": "x" * 100}]
        first = httpx.post(url, json={"model": "m", "messages": too_long}).status_code
        return [first, httpx.post(url, json={"model": "m", "messages": MESSAGES}).status_code]

    assert agent("q") == [400, 200]
    # the long call: extended (400), re-sent as written (400 again); the next call is extended
    assert ["return_token_ids" in body for body in openai_server.requests] == [True, False, True]
    failed, ok = traced.rows("span_type = 'llm'")
    assert failed["status_code"] == "ERROR" and "maximum context length" in failed["status_message"]
    assert [e["name"] for e in json.loads(failed["events"])] == ["tinkertrace.injection_not_at_fault"]
    assert ok["token_source"] == semconv.SOURCE_SERVER and ok["response_token_ids"] == list(REPLY.encode())


def test_refusal_mark_is_rechecked(openai_server, trace_init) -> None:
    """A host that refused the fields is asked again after ``token_ids_recheck_calls`` calls; once it
    accepts them (a server restarted with the extension) ids come back."""
    openai_server.options.reject_fields = ("return_token_ids",)
    traced = trace_init(token_ids_recheck_calls=2)
    url = openai_server.base_url + "/chat/completions"

    @tinkertrace.traced_rollout
    def agent(task: str) -> None:
        for _ in range(4):
            httpx.post(url, json={"model": "m", "messages": MESSAGES}).raise_for_status()
        openai_server.options.reject_fields = ()
        for _ in range(3):
            httpx.post(url, json={"model": "m", "messages": MESSAGES}).raise_for_status()

    agent("q")
    extended = ["return_token_ids" in body for body in openai_server.requests]
    # refused + re-sent, 2 plain calls; asked again: refused + re-sent, 2 plain calls (the server
    # changed meanwhile); asked again: accepted
    assert extended == [True, False, False, False, True, False, False, False, True]
    sources = [r["token_source"] for r in traced.rows("span_type = 'llm'")]
    assert sources == [semconv.SOURCE_NONE] * 6 + [semconv.SOURCE_SERVER]


def test_a_failing_redaction_hook_keeps_the_span_and_says_why(openai_server, trace_init) -> None:
    """The span's content is built on the export thread; a hook failing there costs the content,
    never the span: it keeps its rollout (so the rollout is complete) and names the error."""

    def redact(messages: list[dict]) -> list[dict]:
        raise RuntimeError("no redaction today")

    traced = trace_init(redact=redact)

    @tinkertrace.traced_rollout
    def agent(task: str) -> float:
        httpx.post(openai_server.base_url + "/chat/completions", json={"model": "m", "messages": MESSAGES})
        return 1.0

    agent("q")
    rows = {r["span_type"]: r for r in traced.rows()}
    assert rows.keys() == {"rollout", "llm", "reward"}
    assert rows["llm"]["rollout_id"] == rows["rollout"]["rollout_id"]
    error = json.loads(rows["llm"]["attributes"])[semconv.LLM_CAPTURE_ERROR]
    assert error == "RuntimeError: no redaction today"
    assert tinkertrace.stats()["spans_rejected"] == 0
