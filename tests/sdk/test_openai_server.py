"""The deterministic OpenAI-compatible test server, driven by the real OpenAI client and httpx."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tinkertrace.testing.openai_server import byte_logprob, render_chat, scripted_responder

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "héllo"}]


def test_chat_non_streaming_ids_and_logprobs(openai_server) -> None:
    client = openai.OpenAI(base_url=openai_server.base_url, api_key="x")
    resp = client.chat.completions.create(
        model="m", messages=MESSAGES, logprobs=True, top_logprobs=2, extra_body={"return_token_ids": True}
    )
    reply = "echo: héllo"
    assert resp.choices[0].message.content == reply
    extra = resp.model_dump()
    assert extra["prompt_token_ids"] == list(render_chat(MESSAGES).encode())
    assert extra["choices"][0]["token_ids"] == list(reply.encode())
    lps = resp.choices[0].logprobs.content
    assert [lp.logprob for lp in lps] == [byte_logprob(b) for b in reply.encode()]
    assert len(lps[0].top_logprobs) == 2
    assert resp.usage.completion_tokens == len(reply.encode())


def test_chat_streaming_with_usage_and_unique_ids(openai_server) -> None:
    openai_server.options.responder = scripted_responder(["ab", "cd"])
    client = openai.OpenAI(base_url=openai_server.base_url, api_key="x")
    ids = set()
    for expected in ("ab", "cd"):
        stream = client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
        ids.add(chunks[0].id)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
        assert chunks[-1].usage.completion_tokens == 2
    assert len(ids) == 2


def test_completions_plain_httpx_and_no_token_ids(openai_server) -> None:
    body = {"model": "m", "prompt": "hi", "logprobs": 1, "return_token_ids": True, "max_tokens": 3}
    r = httpx.post(openai_server.base_url + "/completions", json=body)
    choice = r.json()["choices"][0]
    assert choice["text"] == "ech" and choice["finish_reason"] == "length"
    assert choice["token_ids"] == list(b"ech") and choice["prompt_token_ids"] == list(b"hi")
    assert choice["logprobs"]["token_logprobs"] == [byte_logprob(b) for b in b"ech"]
    openai_server.options.token_ids = False
    choice = httpx.post(openai_server.base_url + "/completions", json=body).json()["choices"][0]
    assert "token_ids" not in choice


@pytest.mark.parametrize("body", [b"not json", b"[1]", json.dumps({"messages": []}).encode()])
def test_malformed_requests_get_400_and_server_keeps_running(openai_server, body: bytes) -> None:
    r = httpx.post(openai_server.base_url + "/chat/completions", content=body)
    assert r.status_code == 400 and "error" in r.json()
    assert httpx.get(openai_server.base_url + "/models").json()["data"][0]["id"] == "test-model"


def test_injected_failures_then_recovery(openai_server) -> None:
    openai_server.options.fail_status, openai_server.options.fail_times = 503, 1
    body = {"model": "m", "messages": MESSAGES}
    assert httpx.post(openai_server.base_url + "/chat/completions", json=body).status_code == 503
    assert httpx.post(openai_server.base_url + "/chat/completions", json=body).status_code == 200


@pytest.mark.parametrize("reply", ["echo", "tool", "cut"])
def test_responses_shapes_validate_against_openai_types(openai_server, reply: str) -> None:
    """Every Response and stream event the server sends validates strictly against the OpenAI
    client's own pydantic types, and the stream's final Response equals the non-streaming one."""
    from pydantic import TypeAdapter

    from tinkertrace.testing.openai_server import ToolCall

    if reply == "tool":
        openai_server.options.responder = lambda _: ToolCall("add", '{"a": 1}')
    body = {
        "model": "m",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "héllo"}]}],
        "include": ["message.output_text.logprobs"],
        "return_token_ids": True,
        **({"max_output_tokens": 3} if reply == "cut" else {}),
    }
    url = openai_server.base_url + "/responses"
    plain = httpx.post(url, json=body).json()
    response = openai.types.responses.Response.model_validate(plain, strict=True)
    raw = httpx.post(url, json={**body, "stream": True}).text
    adapter = TypeAdapter(openai.types.responses.ResponseStreamEvent)
    blocks = [b.split("\n") for b in raw.strip().split("\n\n")]
    events = [adapter.validate_python(json.loads(data[6:]), strict=True) for _, data in blocks]
    assert [kind[7:] for kind, _ in blocks] == [e.type for e in events]
    streamed, answered = events[-1].response.model_dump(), response.model_dump()
    for dump in (streamed, answered):  # fresh ids and times per request
        del dump["id"], dump["created_at"], dump["output"][0]["id"]
    assert streamed == answered
    ids = plain["output_token_ids"]
    assert plain["output_token_logprobs"] == [byte_logprob(t) for t in ids]
    assert response.status == ("incomplete" if reply == "cut" else "completed")
    if reply == "cut":
        assert len(ids) == 3 and events[-1].type == "response.incomplete"
    if reply == "tool":
        assert response.output[0].type == "function_call" and bytes(ids).decode().startswith("<tool_call>")
