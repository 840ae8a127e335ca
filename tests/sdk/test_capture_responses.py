"""The Responses API (``client.responses.create``) through the real OpenAI client (3.x, httpx2) and
plain httpx against the test server's ``/v1/responses``: the same RL data as chat calls."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest

import tinkertrace
from tinkertrace import semconv
from tinkertrace.models.tokenizer import BUILTIN_MODEL, load_tokenizer
from tinkertrace.testing.openai_server import ToolCall, byte_logprob, render_chat, scripted_responder

INSTRUCTIONS = "Be brief."
QUESTION = "2+2? ünïcode"
REPLY = "echo: 2+2? ünïcode"
CHAT = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}]


def _ask_sync(client: openai.OpenAI, stream: bool, **extra: object) -> str:
    if not stream:
        return client.responses.create(
            model="m", instructions=INSTRUCTIONS, input=QUESTION, **extra
        ).output_text
    events = client.responses.create(
        model="m", instructions=INSTRUCTIONS, input=QUESTION, stream=True, **extra
    )
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


async def _ask_async(client: openai.AsyncOpenAI, stream: bool) -> str:
    if not stream:
        return (
            await client.responses.create(model="m", instructions=INSTRUCTIONS, input=QUESTION)
        ).output_text
    events = await client.responses.create(model="m", instructions=INSTRUCTIONS, input=QUESTION, stream=True)
    return "".join([e.delta async for e in events if e.type == "response.output_text.delta"])


def _assert_responses_span(row: dict, stream: bool, reply: str = REPLY, finish: str = "stop") -> dict:
    response_ids = list(reply.encode())
    assert row["span_type"] == semconv.TYPE_LLM and row["kind"] == "CLIENT" and row["name"] == "chat m"
    assert row["prompt_token_ids"] == list(render_chat(CHAT).encode())
    assert row["response_token_ids"] == response_ids
    assert row["response_logprobs"] == [byte_logprob(t) for t in response_ids]
    assert row["token_source"] == semconv.SOURCE_SERVER
    assert row["response_id"].startswith("resp-") and row["model"] == "m"
    attrs = json.loads(row["attributes"])
    assert attrs[semconv.LLM_STREAMING] is stream
    assert attrs[semconv.GENAI_FINISH_REASONS] == [finish]
    assert attrs[semconv.GENAI_OPERATION] == "chat"
    assert json.loads(attrs[semconv.GENAI_INPUT_MESSAGES]) == CHAT
    assert attrs[semconv.GENAI_INPUT_TOKENS] == len(row["prompt_token_ids"])
    assert attrs[semconv.GENAI_OUTPUT_TOKENS] == len(response_ids)
    return attrs


@pytest.mark.parametrize("stream", [False, True])
def test_openai_client_responses_sync(openai_server, traced, stream: bool) -> None:
    openai_server.options.policy_version = 3
    client = openai.OpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0)

    @tinkertrace.traced_rollout
    def agent(task: dict) -> float:
        return 1.0 if _ask_sync(client, stream) == REPLY else 0.0

    assert agent({"id": "r-1"}) == 1.0
    sent = openai_server.requests[-1]
    assert sent["return_token_ids"] is True and sent["include"] == [semconv.RESPONSES_INCLUDE_LOGPROBS]
    (row,) = traced.rows("span_type = 'llm'")
    attrs = _assert_responses_span(row, stream)
    assert row["policy_version"] == 3
    out = json.loads(attrs[semconv.GENAI_OUTPUT_MESSAGES])
    assert out == [{"role": "assistant", "content": REPLY, "finish_reason": "stop"}]
    (root,) = traced.rows("span_type = 'rollout'")
    assert row["parent_span_id"] == root["span_id"] and row["rollout_id"] == root["rollout_id"]
    assert json.loads(root["attributes"])[semconv.ROLLOUT_LLM_CALLS] == 1


@pytest.mark.parametrize("stream", [False, True])
def test_openai_client_responses_async(openai_server, traced, stream: bool) -> None:
    client = openai.AsyncOpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0)

    @tinkertrace.traced_rollout
    async def agent(task: str) -> str:
        return await _ask_async(client, stream)

    assert asyncio.run(agent("q")) == REPLY
    (row,) = traced.rows("span_type = 'llm'")
    _assert_responses_span(row, stream)


def test_responses_stream_helper_and_own_include_kept(openai_server, traced) -> None:
    """``client.responses.stream`` (the accumulating helper) gets well-formed events; an agent's own
    ``include`` list keeps its values and gains the logprobs one."""
    client = openai.OpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0)
    own = ["reasoning.encrypted_content"]

    @tinkertrace.traced_rollout
    def agent(task: str) -> str:
        with client.responses.stream(model="m", instructions=INSTRUCTIONS, input=QUESTION, include=own) as s:
            return s.get_final_response().output_text

    assert agent("q") == REPLY
    assert openai_server.requests[-1]["include"] == [*own, semconv.RESPONSES_INCLUDE_LOGPROBS]
    (row,) = traced.rows("span_type = 'llm'")
    _assert_responses_span(row, stream=True)


@pytest.mark.parametrize("stream", [False, True])
def test_responses_tool_call_and_truncation(openai_server, traced, stream: bool) -> None:
    """Tool-call tokens are part of the output ids; a ``max_output_tokens`` cut says ``length``."""
    call = ToolCall("add", '{"a": 2, "b": 2}', call_id="call_7")
    openai_server.options.responder = scripted_responder([call, "a long reply text"])  # type: ignore[list-item]
    client = openai.OpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0)
    tools = [{"type": "function", "name": "add", "parameters": {"type": "object", "properties": {}}}]

    @tinkertrace.traced_rollout
    def agent(task: str) -> None:
        _ask_sync(client, stream, tools=tools)
        _ask_sync(client, stream, max_output_tokens=6)

    agent("q")
    tool_row, cut_row = traced.rows("span_type = 'llm'")
    attrs = _assert_responses_span(tool_row, stream, reply=call.text(), finish="tool_calls")
    (message,) = json.loads(attrs[semconv.GENAI_OUTPUT_MESSAGES])
    assert message["tool_calls"] == [
        {"id": "call_7", "type": "function", "function": {"name": "add", "arguments": call.arguments}}
    ]
    _assert_responses_span(cut_row, stream, reply="a long", finish="length")


def test_responses_retokenized_without_server_ids(openai_server, trace_init) -> None:
    openai_server.options.token_ids = False
    traced = trace_init(tokenizer=BUILTIN_MODEL)
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "4"},
    ]

    @tinkertrace.traced_rollout
    def agent(task: str) -> None:
        body = {"model": "m", "instructions": INSTRUCTIONS, "input": items}
        httpx.post(openai_server.base_url + "/responses", json=body).raise_for_status()

    agent("q")
    (row,) = traced.rows("span_type = 'llm'")
    tok = load_tokenizer(BUILTIN_MODEL)
    chat = [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "4"},
    ]
    assert json.loads(json.loads(row["attributes"])[semconv.GENAI_INPUT_MESSAGES]) == chat
    expected = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert row["token_source"] == semconv.SOURCE_RETOKENIZED
    assert row["prompt_token_ids"] == list(expected)
    reply = "echo: " + QUESTION
    assert row["response_token_ids"] == tok.encode(reply, add_special_tokens=False)
    assert row["response_logprobs"] == [byte_logprob(t) for t in reply.encode()]  # from output_text


def test_responses_stream_left_early_keeps_what_it_had(openai_server, traced) -> None:
    client = openai.OpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0)

    @tinkertrace.traced_rollout
    def agent(task: str) -> str:
        deltas = []
        stream = client.responses.create(model="m", input=QUESTION, stream=True)
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
                if len(deltas) == 3:
                    break
        stream.close()
        return "".join(deltas)

    assert agent("q") == "ech"
    (early,) = traced.rows("span_type = 'llm'")
    attrs = json.loads(early["attributes"])
    assert attrs[semconv.LLM_CLOSED_EARLY] is True
    assert early["response_id"].startswith("resp-")
    assert json.loads(attrs[semconv.GENAI_OUTPUT_MESSAGES])[0]["content"].startswith("ech")
    assert early["token_source"] == semconv.SOURCE_NONE  # ids come only with the final event


def test_httpx_async_responses_stream(openai_server, traced) -> None:
    """The httpx family (LiteLLM, openai 2.x): an async streamed Responses call, bytes unchanged."""
    body = {"model": "m", "instructions": INSTRUCTIONS, "input": QUESTION, "stream": True}

    @tinkertrace.traced_rollout
    async def agent(task: str) -> bytes:
        async with (
            httpx.AsyncClient() as client,
            client.stream("POST", openai_server.base_url + "/responses", json=body) as response,
        ):
            return b"".join([chunk async for chunk in response.aiter_raw()])

    raw = asyncio.run(agent("q"))
    events = [json.loads(line[5:]) for line in raw.splitlines() if line.startswith(b"data:")]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["output_token_ids"] == list(REPLY.encode())
    (row,) = traced.rows("span_type = 'llm'")
    _assert_responses_span(row, stream=True)


def test_refusal_on_responses_leaves_chat_extended(openai_server, traced) -> None:
    """A server that refuses the logprobs ``include`` on /responses keeps giving ids on chat."""
    openai_server.options.reject_fields = ("include",)
    client = openai.OpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0)

    @tinkertrace.traced_rollout
    def agent(task: str) -> None:
        client.responses.create(model="m", input=QUESTION)
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": QUESTION}])
        client.responses.create(model="m", input=QUESTION)

    agent("q")
    assert [("include" in b, "return_token_ids" in b) for b in openai_server.requests] == [
        (True, True),  # refused
        (False, False),  # the agent's own body: taken, /responses marked
        (False, True),  # chat still extended
        (False, False),  # /responses not extended while marked
    ]
    sources = [r["token_source"] for r in traced.rows("span_type = 'llm'")]
    assert sources == [semconv.SOURCE_NONE, semconv.SOURCE_SERVER, semconv.SOURCE_NONE]
