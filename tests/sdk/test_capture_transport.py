"""Capture at the transport (httpx's public layering), the explicit ``traced_transport`` path, and the
fenced fallback for clients with a transport of their own."""

from __future__ import annotations

import asyncio
import importlib.metadata
import urllib.request

import httpx
import httpx2
import openai
import pytest

import tinkertrace
from tinkertrace.sdk import capture_fallback
from tinkertrace.sdk.capture_transport import traced_transport
from tinkertrace.testing.openai_server import render_chat

MESSAGES = [{"role": "user", "content": "hi"}]
REPLY = "echo: hi"


def _urllib_handler(request: httpx.Request) -> httpx.Response:
    """A transport of the client's own that reaches the server without any httpx transport."""
    sent = urllib.request.Request(str(request.url), data=request.content, method=request.method)
    for name, value in request.headers.items():
        if name.lower() not in ("content-length", "host", "accept-encoding"):
            sent.add_header(name, value)
    with urllib.request.urlopen(sent, timeout=30) as answer:
        body = httpx.ByteStream(answer.read())  # a body the client reads through the transport's stream
        return httpx.Response(answer.status, headers=dict(answer.headers.items()), stream=body)


def _chat(client: httpx.Client, base_url: str) -> dict:
    answer = client.post(base_url + "/chat/completions", json={"model": "m", "messages": MESSAGES})
    answer.raise_for_status()
    return answer.json()


def _one_llm_span(traced) -> dict:
    (row,) = traced.rows("span_type = 'llm'")
    assert row["prompt_token_ids"] == list(render_chat(MESSAGES).encode())
    assert row["response_token_ids"] == list(REPLY.encode())
    return row


def test_the_fallback_is_pinned_to_the_installed_versions() -> None:
    """The fallback wraps private methods: it is installed only on versions it was tested on. When this
    fails after an upgrade, run this file against the new version and extend TESTED_VERSIONS."""
    assert capture_fallback.supported(httpx), importlib.metadata.version("httpx")
    assert capture_fallback.supported(httpx2), importlib.metadata.version("httpx2")


def test_default_transports_are_captured_without_the_fallback(
    openai_server, trace_init, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The OpenAI client (httpx2) and plain httpx, sync and async, through their default transports: the
    public seam alone captures them (the fallback's private wrap is not installed)."""
    monkeypatch.setattr(capture_fallback, "install", lambda lib: False)
    traced = trace_init()
    assert not capture_fallback._originals

    @tinkertrace.traced_rollout
    def agent(task: str) -> str:
        client = openai.OpenAI(base_url=openai_server.base_url, api_key="EMPTY")
        reply = client.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        with httpx.Client() as plain:
            _chat(plain, openai_server.base_url)
        return reply.choices[0].message.content or ""

    @tinkertrace.traced_rollout
    async def async_agent(task: str) -> dict:
        async with httpx.AsyncClient() as client:
            answer = await client.post(
                openai_server.base_url + "/chat/completions", json={"model": "m", "messages": MESSAGES}
            )
            return answer.json()

    assert agent("q") == REPLY
    assert asyncio.run(async_agent("q"))["choices"][0]["message"]["content"] == REPLY
    rows = traced.rows("span_type = 'llm'")
    assert len(rows) == 3
    assert all(r["response_token_ids"] == list(REPLY.encode()) for r in rows)


def test_a_transport_of_the_clients_own_is_captured_by_the_fallback(openai_server, traced) -> None:
    @tinkertrace.traced_rollout
    def agent(task: str) -> dict:
        with httpx.Client(transport=httpx.MockTransport(_urllib_handler)) as client:
            return _chat(client, openai_server.base_url)

    assert agent("q")["choices"][0]["message"]["content"] == REPLY
    _one_llm_span(traced)


def test_traced_transport_captures_once_without_or_with_the_other_layers(
    openai_server, trace_init, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``traced_transport`` alone (no fallback), and wrapped around a default transport that is traced
    too: each call is one span."""
    monkeypatch.setattr(capture_fallback, "install", lambda lib: False)
    traced = trace_init()

    @tinkertrace.traced_rollout
    def agent(task: str) -> None:
        with httpx.Client(transport=traced_transport(httpx.MockTransport(_urllib_handler))) as own:
            _chat(own, openai_server.base_url)
        with httpx.Client(transport=traced_transport(httpx.HTTPTransport())) as doubly:
            _chat(doubly, openai_server.base_url)

    agent("q")
    assert len(traced.rows("span_type = 'llm'")) == 2


def test_traced_transport_refuses_what_is_not_a_transport() -> None:
    with pytest.raises(TypeError, match="not an httpx or httpx2 transport: str"):
        traced_transport("http://127.0.0.1")
