"""``/v1/responses`` with the real OpenAI client (sync, streaming) over a real socket.

The backend is the hosted-Tinker double with scripted replies, so output items, token ids and
logprobs have exact expected values; every stream event is also checked against the ``openai``
package's event union with validation on.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from tinkertrace import semconv
from tinkertrace.serving.policy import PolicyHolder

CALC = {
    "type": "function",
    "name": "calc",
    "description": "Evaluate an expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
}
CALL_REPLY = 'Computing.<tool_call>{"name": "calc", "arguments": {"expression": "2+3"}}</tool_call>'
IDS = {"return_token_ids": True}
EVENTS = TypeAdapter(ResponseStreamEvent)


@pytest.fixture
def served(start_server, scripted, tokenizer, openai_client):
    """``served(replies, **create_app_options)`` -> (OpenAI client, sampler, server)."""

    def start(replies: list[str], **options: Any):
        sampler = scripted(replies)
        server = start_server(PolicyHolder(sampler, tokenizer, "m", version=3), **options)
        return openai_client(server), sampler, server

    return start


def _sampled(tokenizer: Any, text: str) -> list[int]:
    return [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]


def test_text_reply_with_ids_logprobs_and_version(served, tokenizer) -> None:
    client, sampler, _ = served(["the answer is 5"])
    raw = client.responses.with_raw_response.create(
        model="m",
        instructions="Be brief.",
        input="what is 2+3?",
        include=["message.output_text.logprobs"],
        extra_body=IDS,
    )
    resp = raw.parse()
    assert raw.headers[semconv.HEADER_POLICY_VERSION] == "3"
    assert resp.status == "completed" and resp.output_text == "the answer is 5"
    extra = resp.model_extra
    ids = _sampled(tokenizer, "the answer is 5")
    assert extra[semconv.RESPONSES_OUTPUT_TOKEN_IDS] == ids
    assert extra[semconv.RESPONSES_PROMPT_TOKEN_IDS] == sampler.calls[0][0]
    assert tokenizer.decode(sampler.calls[0][0]).startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert extra[semconv.RESPONSES_OUTPUT_LOGPROBS] == [-((t % 16) + 1) / 16 for t in ids]
    assert [lp.logprob for lp in resp.output[0].content[0].logprobs] == extra[
        semconv.RESPONSES_OUTPUT_LOGPROBS
    ]
    assert extra[semconv.RESPONSE_POLICY_VERSION] == 3
    assert resp.usage.output_tokens == len(ids) and resp.usage.input_tokens == len(sampler.calls[0][0])
    assert resp.id.startswith("resp_") and resp.output[0].id.startswith("msg_")


def test_function_calls_and_their_outputs_round_trip(served, tokenizer) -> None:
    client, sampler, _ = served([CALL_REPLY, "It is 5."])
    first = client.responses.create(model="m", input="what is 2+3?", tools=[CALC], extra_body=IDS)
    message, call = first.output
    assert message.type == "message" and message.content[0].text == "Computing."
    assert call.type == "function_call" and call.name == "calc"
    assert json.loads(call.arguments) == {"expression": "2+3"} and call.call_id.startswith("call_")
    assert first.model_extra[semconv.RESPONSES_OUTPUT_TOKEN_IDS] == _sampled(tokenizer, CALL_REPLY)
    # the next turn sends the output items back with the tool's result, as the Agents SDK does
    items = [
        {"role": "user", "content": "what is 2+3?"},
        *(item.model_dump(exclude_none=True) for item in first.output),
        {"type": "function_call_output", "call_id": call.call_id, "output": "5"},
    ]
    second = client.responses.create(model="m", input=items, tools=[CALC])
    assert second.output_text == "It is 5." and second.tool_choice == "auto"
    prompt = tokenizer.decode(sampler.calls[-1][0])
    assert prompt.endswith(
        "<|im_start|>assistant\nComputing.\n<tool_call>\n"
        '{"name": "calc", "arguments": {"expression": "2+3"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_stream_events_parse_and_end_with_the_whole_response(served, tokenizer) -> None:
    client, _, server = served([CALL_REPLY, "x" * 50])
    with client.responses.stream(
        model="m", input="go", tools=[CALC], include=["message.output_text.logprobs"], extra_body=IDS
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "response.function_call_arguments.done" in kinds and "response.output_text.delta" in kinds
    assert final.output_text == "Computing." and final.output[1].name == "calc"
    assert final.model_extra[semconv.RESPONSES_OUTPUT_TOKEN_IDS] == _sampled(tokenizer, CALL_REPLY)
    assert final.model_extra[semconv.RESPONSE_POLICY_VERSION] == 3
    # every event validates against openai's own types; a cut reply ends with response.incomplete
    body = {"model": "m", "input": "go", "stream": True, "max_output_tokens": 7, **IDS}
    with httpx.stream("POST", server.url + "/v1/responses", json=body) as resp:
        lines = [line for line in resp.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    data = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    assert names == [d["type"] for d in data] and names[-1] == "response.incomplete"
    for event in data:
        EVENTS.validate_python(event)
    last = data[-1]["response"]
    assert last["status"] == "incomplete" and last["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last[semconv.RESPONSES_OUTPUT_TOKEN_IDS] == _sampled(tokenizer, "x" * 50)[:7]


def test_tool_choice_forces_a_named_call_and_none_leaves_text(served, tokenizer) -> None:
    client, sampler, _ = served(['{"expression": "1"}}', CALL_REPLY])
    named = client.responses.create(
        model="m", input="go", tools=[CALC], tool_choice={"type": "function", "name": "calc"}
    )
    assert [(o.type, o.name) for o in named.output] == [("function_call", "calc")]
    assert named.tool_choice.name == "calc" and named.parallel_tool_calls is True
    assert tokenizer.decode(sampler.calls[-1][0]).endswith('{"name": "calc", "arguments": ')
    none = client.responses.create(model="m", input="go", tools=[CALC], tool_choice="none")
    assert none.output_text == CALL_REPLY and len(none.output) == 1


def test_previous_response_id_continues_a_stored_conversation(served, tokenizer) -> None:
    client, sampler, _ = served(["first", "second", "third"])
    first = client.responses.create(model="m", input="one")
    client.responses.create(model="m", input="two", previous_response_id=first.id)
    assert tokenizer.decode(sampler.calls[-1][0]).endswith(
        "user\none<|im_end|>\n<|im_start|>assistant\nfirst<|im_end|>\n"
        "<|im_start|>user\ntwo<|im_end|>\n<|im_start|>assistant\n"
    )
    unstored = client.responses.create(model="m", input="three", store=False)
    for missing in ("resp_unknown", unstored.id):
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model="m", input="x", previous_response_id=missing)
        assert err.value.body["param"] == "previous_response_id"
        assert err.value.body["code"] == "previous_response_not_found"


@pytest.mark.parametrize(
    ("extra", "param", "code"),
    [
        ({"tools": [{"type": 5}]}, "tools[0].type", "invalid_type"),  # hosted tools: test_codex_responses
        ({"tools": [{"type": "function", "name": "a b"}]}, "tools[0].name", "invalid_value"),
        ({"tools": [CALC], "tool_choice": {"type": "function", "name": "x"}}, "tool_choice", "invalid_value"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type", "unsupported"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "input[0].content[0].type",
            "unsupported",
        ),
        ({"input": [{"type": "function_call_output", "output": "5"}]}, "input[0].call_id", None),
        ({"input": None}, "input", "missing_required_parameter"),
        ({"max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
    ],
)
def test_refused_requests_get_openai_errors(served, extra, param, code) -> None:
    client, _, _ = served(["ok"])
    body = {"input": "hi", **extra}
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="m", **body)
    assert err.value.body["param"] == param and err.value.body["message"]
    if code is not None:
        assert err.value.body["code"] == code
