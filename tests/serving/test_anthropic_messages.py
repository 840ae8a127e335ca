"""Anthropic's Messages API on the endpoint and through the proxy, checked with the `anthropic` package's
own client and types (as the OpenAI shapes are checked with `openai`'s), and recorded token-exact."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import duckdb
import httpx
import pytest
from anthropic.types import Message

from tinkertrace import semconv
from tinkertrace.netutil import BackgroundServer
from tinkertrace.serving.policy import PolicyHolder
from tinkertrace.serving.proxy import create_proxy_app
from tinkertrace.serving.recording import CallRecorder
from tinkertrace.spanstore.reader import open_spans

MODEL = "scripted-model"


@pytest.fixture
def served(
    tmp_path: Path,
    tokenizer: Any,
    scripted: Any,
    recording: Any,
    start_server: Callable[..., BackgroundServer],
) -> tuple[BackgroundServer, CallRecorder, Any]:
    sampler = recording(scripted(["Hello from the endpoint.", "A second answer"]))
    recorder = CallRecorder(spans_dir=tmp_path / "spans", schedule_delay_s=0.05)
    server = start_server(PolicyHolder(sampler, tokenizer, MODEL, version=4), recorder=recorder)
    return server, recorder, sampler


def _attr(name: str) -> str:
    return f"json_extract_string(attributes, '$.\"{name}\"')"


def _llm_rows(tmp_path: Path) -> list[tuple]:
    con = duckdb.connect()
    open_spans(con, tmp_path / "spans")
    return con.execute(
        "SELECT rollout_id, task_id, response_id, prompt_token_ids, response_token_ids, "
        f"len(response_logprobs), policy_version, token_source, {_attr(semconv.GENAI_INPUT_MESSAGES)}, "
        f"{_attr(semconv.GENAI_FINISH_REASONS)} "
        "FROM spans WHERE span_type = 'llm' ORDER BY start_time"
    ).fetchall()


def test_messages_create_and_stream_with_the_anthropic_client(served, tmp_path: Path) -> None:
    server, recorder, sampler = served
    client = anthropic.Anthropic(base_url=f"{server.url}/rollouts/r-a/task/t-a", api_key="k", max_retries=0)
    message = client.messages.create(
        model=MODEL,
        max_tokens=64,
        system="Be brief.",
        messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    )
    assert isinstance(message, Message) and message.type == "message" and message.role == "assistant"
    [sequence] = sampler.sequences()
    extra = message.model_extra or {}
    assert extra["output_token_ids"] == sequence and extra["policy_version"] == 4
    assert message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens == len(extra["prompt_token_ids"])
    assert message.usage.output_tokens == len(sequence)

    with client.messages.stream(
        model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "again"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert isinstance(final, Message) and final.content[0].text == text and text
    assert final.id.startswith("msg_") and final.stop_reason in ("end_turn", "max_tokens")
    assert recorder.flush(30)

    rows = _llm_rows(tmp_path)
    assert [(r[0], r[1], r[2]) for r in rows] == [("r-a", "t-a", message.id), ("r-a", "t-a", final.id)]
    assert rows[0][3] == extra["prompt_token_ids"] and rows[0][4] == sequence
    assert rows[1][4] == sampler.sequences()[1]
    for row in rows:
        assert row[5] == len(row[4]) and row[6:8] == (4, semconv.SOURCE_SERVER)
    assert json.loads(rows[0][8])[0] == {"role": "system", "content": "Be brief."}
    assert json.loads(rows[1][9]) == [final.stop_reason]


def test_bad_messages_requests_are_clear_400s(served) -> None:
    server, _, _ = served
    client = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="tools"):
        client.messages.create(
            model=MODEL,
            max_tokens=8,
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"input_schema": {}}],
        )
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    with pytest.raises(anthropic.BadRequestError, match="'image' blocks are not served"):
        client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": [image]}])
    url = f"{server.url}/v1/messages"
    for body, words in (
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        ({"model": MODEL, "max_tokens": 8, "messages": []}, "messages"),
        ({"model": MODEL, "max_tokens": 8, "messages": [{"role": "tool", "content": "x"}]}, "role"),
    ):
        answer = httpx.post(url, json=body, timeout=10)
        assert answer.status_code == 400 and words in answer.json()["error"]["message"], answer.text
    ok = client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "still up"}])
    assert ok.content[0].text


def test_messages_through_the_proxy(served, tmp_path: Path) -> None:
    server, _, sampler = served
    recorder = CallRecorder(spans_dir=tmp_path / "proxy-spans", schedule_delay_s=0.05)
    with BackgroundServer(create_proxy_app(server.url + "/v1", recorder=recorder)) as proxy:
        client = anthropic.Anthropic(base_url=f"{proxy.url}/rollouts/r-px", api_key="k", max_retries=0)
        with client.messages.stream(
            model=MODEL, max_tokens=32, messages=[{"role": "user", "content": "x"}]
        ) as s:
            final = s.get_final_message()
        assert recorder.flush(30)
    con = duckdb.connect()
    open_spans(con, tmp_path / "proxy-spans")
    [(rollout, response_id, ids)] = con.execute(
        "SELECT rollout_id, response_id, response_token_ids FROM spans WHERE span_type = 'llm'"
    ).fetchall()
    assert (rollout, response_id) == ("r-px", final.id)
    assert ids == (final.model_extra or {}).get("output_token_ids", ids) == sampler.sequences()[-1]


CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
ADD = {"name": "add", "description": "Add two numbers.", "input_schema": {"type": "object"}}


def test_tool_use_round_trip_with_the_anthropic_client(
    tmp_path: Path, tokenizer: Any, scripted: Any, start_server: Callable[..., BackgroundServer]
) -> None:
    recorder = CallRecorder(spans_dir=tmp_path / "spans", schedule_delay_s=0.05)
    policy = PolicyHolder(scripted([CALL, "The sum is 5.", CALL]), tokenizer, MODEL)
    server = start_server(policy, recorder=recorder)
    client = anthropic.Anthropic(base_url=f"{server.url}/rollouts/r-t", api_key="k", max_retries=0)
    ask = [{"role": "user", "content": "What is 2 + 3?"}]

    first = client.messages.create(model=MODEL, max_tokens=200, messages=ask, tools=[ADD])
    [use] = [b for b in first.content if b.type == "tool_use"]
    assert (use.name, use.input, first.stop_reason) == ("add", {"a": 2, "b": 3}, "tool_use")
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "5"}
    history = [*ask, {"role": "assistant", "content": first.content}, {"role": "user", "content": [result]}]
    second = client.messages.create(model=MODEL, max_tokens=200, messages=history, tools=[ADD])
    assert second.content[0].text == "The sum is 5." and second.stop_reason == "end_turn"
    with client.messages.stream(
        model=MODEL, max_tokens=200, messages=ask, tools=[ADD], tool_choice={"type": "auto"}
    ) as stream:
        streamed = stream.get_final_message()
    assert [(b.type, getattr(b, "input", None)) for b in streamed.content] == [("tool_use", {"a": 2, "b": 3})]
    assert recorder.flush(30)

    rows = _llm_rows(tmp_path)
    assert [json.loads(r[9]) for r in rows] == [["tool_use"], ["end_turn"], ["tool_use"]]
    asked = json.loads(rows[1][8])  # the tool round trip, as chat messages
    assert asked[1]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a":2,"b":3}'}
    assert asked[2] == {"role": "tool", "tool_call_id": use.id, "content": "5"}
    con = duckdb.connect()
    open_spans(con, tmp_path / "spans")
    output_sql = f"SELECT {_attr(semconv.GENAI_OUTPUT_MESSAGES)} FROM spans WHERE span_type = 'llm'"
    outputs = con.execute(output_sql + " ORDER BY start_time").fetchall()
    for (output,) in (outputs[0], outputs[2]):  # streamed or not, the call is recorded as a tool call
        [message] = json.loads(output)
        assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"a": 2, "b": 3}
