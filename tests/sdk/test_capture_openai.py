"""The real OpenAI client (3.x, httpx2) against the test server: every captured value, exactly."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import openai
import pytest

import tinkertrace
from tinkertrace import semconv
from tinkertrace.testing.openai_server import byte_logprob, render_chat

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2? ünïcode"}]
REPLY = "echo: 2+2? ünïcode"
PROMPT = "Complete: ab"
COMPLETION = "echo: Complete: ab"


def _expected(kind: str) -> tuple[list[int], list[int]]:
    if kind == "chat":
        return list(render_chat(MESSAGES).encode()), list(REPLY.encode())
    return list(PROMPT.encode()), list(COMPLETION.encode())


def _call_sync(client: openai.OpenAI, kind: str, stream: bool) -> str:
    if kind == "chat":
        if not stream:
            return client.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content
        chunks = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    if not stream:
        return client.completions.create(model="m", prompt=PROMPT).choices[0].text
    return "".join(
        c.choices[0].text for c in client.completions.create(model="m", prompt=PROMPT, stream=True)
    )


async def _call_async(client: openai.AsyncOpenAI, kind: str, stream: bool) -> str:
    if kind == "chat":
        if not stream:
            resp = await client.chat.completions.create(model="m", messages=MESSAGES)
            return resp.choices[0].message.content
        chunks = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
    if not stream:
        return (await client.completions.create(model="m", prompt=PROMPT)).choices[0].text
    chunks = await client.completions.create(model="m", prompt=PROMPT, stream=True)
    return "".join([c.choices[0].text async for c in chunks])


def _assert_llm_span(row: dict, kind: str, stream: bool, reply: str) -> None:
    prompt_ids, response_ids = _expected(kind)
    assert row["span_type"] == semconv.TYPE_LLM and row["kind"] == "CLIENT"
    assert row["name"] == ("chat m" if kind == "chat" else "text_completion m")
    assert row["prompt_token_ids"] == prompt_ids
    assert row["response_token_ids"] == response_ids
    np.testing.assert_array_equal(
        np.asarray(row["response_logprobs"], dtype=np.float32),
        np.asarray([byte_logprob(t) for t in response_ids], dtype=np.float32),
    )
    assert row["token_source"] == semconv.SOURCE_SERVER
    assert row["model"] == "m" and row["response_id"].startswith("chatcmpl-" if kind == "chat" else "cmpl-")
    attrs = json.loads(row["attributes"])
    assert attrs[semconv.LLM_STREAMING] is stream
    assert attrs[semconv.GENAI_FINISH_REASONS] == ["stop"]
    expected_in = MESSAGES if kind == "chat" else [{"role": "user", "content": PROMPT}]
    assert json.loads(attrs[semconv.GENAI_INPUT_MESSAGES]) == expected_in
    out = json.loads(attrs[semconv.GENAI_OUTPUT_MESSAGES])
    assert out == [{"role": "assistant", "content": reply, "finish_reason": "stop"}]
    if not stream:
        assert attrs[semconv.GENAI_INPUT_TOKENS] == len(prompt_ids)
        assert attrs[semconv.GENAI_OUTPUT_TOKENS] == len(response_ids)


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("stream", [False, True])
def test_sync_client_capture(openai_server, traced, kind: str, stream: bool) -> None:
    client = openai.OpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0)

    @tinkertrace.traced_rollout
    def agent(task: dict) -> str:
        return _call_sync(client, kind, stream)

    reply = agent({"id": "t-1"})
    assert reply == (REPLY if kind == "chat" else COMPLETION)
    sent = openai_server.requests[-1]
    assert sent["return_token_ids"] is True and sent["logprobs"] == (True if kind == "chat" else 1)
    (row,) = traced.rows("span_type = 'llm'")
    _assert_llm_span(row, kind, stream, reply)
    (root,) = traced.rows("span_type = 'rollout'")
    assert row["rollout_id"] == root["rollout_id"] and row["task_id"] == "t-1"
    assert row["parent_span_id"] == root["span_id"]
    assert json.loads(root["attributes"])[semconv.ROLLOUT_LLM_CALLS] == 1


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("stream", [False, True])
def test_async_client_capture(openai_server, traced, kind: str, stream: bool) -> None:
    client = openai.AsyncOpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0)

    @tinkertrace.traced_rollout
    async def agent(task: dict) -> str:
        return await _call_async(client, kind, stream)

    reply = asyncio.run(agent({"id": "t-2"}))
    (row,) = traced.rows("span_type = 'llm'")
    _assert_llm_span(row, kind, stream, reply)


def test_calls_outside_a_rollout_are_not_touched(openai_server, traced) -> None:
    client = openai.OpenAI(base_url=openai_server.base_url, api_key="x")
    client.chat.completions.create(model="m", messages=MESSAGES)
    assert "return_token_ids" not in openai_server.requests[-1]
    assert traced.rows() == []


def test_policy_version_and_stream_closed_early(openai_server, traced) -> None:
    openai_server.options.policy_version = 7
    client = openai.OpenAI(base_url=openai_server.base_url, api_key="x")

    @tinkertrace.traced_rollout
    def agent(task: str) -> str:
        stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        first = [next(iter(stream)) for _ in range(3)]
        stream.close()
        return "".join(c.choices[0].delta.content or "" for c in first)

    assert agent("q") == "ec"
    (row,) = traced.rows("span_type = 'llm'")
    assert row["policy_version"] == 7
    assert json.loads(row["attributes"])[semconv.LLM_CLOSED_EARLY] is True
