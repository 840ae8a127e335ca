"""Structured tool calls on /v1/chat/completions, with the real OpenAI client over a real socket.

The backend is the hosted-Tinker double replying with scripted texts, so the sampled tool-call
syntax (and so the parsed calls, finish reasons and token ids) is known exactly.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tinkertrace import semconv
from tinkertrace.models.tokenizer import CHATML_TEMPLATE
from tinkertrace.serving.policy import PolicyHolder
from tinkertrace.serving.tool_parsers import HermesToolParser, make_tool_parser

USER = [{"role": "user", "content": "what is 2+3 and 4*5?"}]
CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
OTHER = {"type": "function", "function": {"name": "other"}}
TWO_CALLS = (
    "Let me compute.\n<tool_call>\n"
    '{"name": "calc", "arguments": {"expression": "2+3"}}\n</tool_call>\n'
    '<tool_call>{"name": "calc", "arguments": {"expression": "4*5"}}</tool_call>'
)


def _server(start_server, scripted, tokenizer, replies: list[str], **options: Any):
    sampler = scripted(replies)
    return start_server(PolicyHolder(sampler, tokenizer, "m"), **options), sampler


def _sampled_ids(tokenizer: Any, text: str) -> list[int]:
    return [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]


def _calls(message: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def test_parsed_calls_keep_the_sampled_token_ids(start_server, scripted, tokenizer, openai_client) -> None:
    server, _ = _server(start_server, scripted, tokenizer, [TWO_CALLS])
    resp = openai_client(server).chat.completions.create(
        model="m", messages=USER, tools=[CALC], logprobs=True
    )
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me compute.\n"
    assert _calls(choice.message) == [("calc", {"expression": "2+3"}), ("calc", {"expression": "4*5"})]
    ids = [c.id for c in choice.message.tool_calls]
    assert len(set(ids)) == 2 and all(i.startswith("call_") for i in ids)
    assert choice.model_extra[semconv.RESPONSE_CHOICE_TOKEN_IDS] == _sampled_ids(tokenizer, TWO_CALLS)
    assert len(choice.logprobs.content) == len(_sampled_ids(tokenizer, TWO_CALLS))


def test_streamed_tool_calls_reassemble_with_the_client(
    start_server, scripted, tokenizer, openai_client
) -> None:
    server, _ = _server(start_server, scripted, tokenizer, [TWO_CALLS, '<tool_call>{"name": "calc"}'])
    client = openai_client(server)
    with client.chat.completions.stream(model="m", messages=USER, tools=[CALC]) as stream:
        chunks = [event.chunk for event in stream if event.type == "chunk"]
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert final.choices[0].finish_reason == "tool_calls"
    assert message.content == "Let me compute.\n"
    assert _calls(message) == [("calc", {"expression": "2+3"}), ("calc", {"expression": "4*5"})]
    ids = [i for c in chunks for ch in c.choices for i in (ch.model_extra or {}).get("token_ids", [])]
    assert ids == _sampled_ids(tokenizer, TWO_CALLS)
    # a call without its closing tag at the end of the reply is accepted, with no content
    again = client.chat.completions.create(model="m", messages=USER, tools=[CALC], stream=True)
    deltas = [c.choices[0].delta for c in again if c.choices]
    assert not any(d.content for d in deltas)
    heads = [tc for d in deltas for tc in d.tool_calls or [] if tc.id]
    assert [(h.index, h.function.name) for h in heads] == [(0, "calc")]


def test_malformed_call_stays_text_with_its_finish_reason(
    start_server, scripted, tokenizer, openai_client
) -> None:
    bad = 'ok <tool_call>{"name": "calc", "arguments": {expression: 1}}</tool_call>'
    server, _ = _server(start_server, scripted, tokenizer, [bad])
    for stream in (False, True):
        resp = openai_client(server).chat.completions.create(
            model="m", messages=USER, tools=[CALC], stream=stream
        )
        if stream:
            chunks = list(resp)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
            assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)
        else:
            text, finish = resp.choices[0].message.content, resp.choices[0].finish_reason
            assert resp.choices[0].message.tool_calls is None
        assert text == bad and finish == "malformed_tool_call"


def test_tool_choice_none_required_and_named(start_server, scripted, tokenizer, openai_client) -> None:
    replies = [
        TWO_CALLS,
        '{"name": "calc", "arguments": {"expression": "1"}}\n</tool_call>',
        '{"expression": "7"}}',
    ]
    server, sampler = _server(start_server, scripted, tokenizer, replies)
    client = openai_client(server)
    tools = [CALC, OTHER]

    none = client.chat.completions.create(model="m", messages=USER, tools=tools, tool_choice="none")
    assert none.choices[0].message.content == TWO_CALLS and none.choices[0].finish_reason == "stop"

    required = client.chat.completions.create(model="m", messages=USER, tools=tools, tool_choice="required")
    assert tokenizer.decode(sampler.calls[-1][0]).endswith("<|im_start|>assistant\n<tool_call>\n")
    assert _calls(required.choices[0].message) == [("calc", {"expression": "1"})]

    named = client.chat.completions.create(
        model="m",
        messages=USER,
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "calc"}},
    )
    prompt_ids = named.model_extra[semconv.RESPONSE_PROMPT_TOKEN_IDS]
    assert tokenizer.decode(prompt_ids).endswith('<tool_call>\n{"name": "calc", "arguments": ')
    assert prompt_ids == sampler.calls[-1][0]  # the forced opening is prompt, not sampled output
    assert "</tool_call>" in sampler.calls[-1][2].stop  # one call only
    assert _calls(named.choices[0].message) == [("calc", {"expression": "7"})]
    assert named.choices[0].finish_reason == "tool_calls"
    ids = named.choices[0].model_extra[semconv.RESPONSE_CHOICE_TOKEN_IDS]
    assert ids == _sampled_ids(tokenizer, '{"expression": "7"}}')


def test_parallel_tool_calls_false_samples_one_call(start_server, scripted, tokenizer, openai_client) -> None:
    server, sampler = _server(start_server, scripted, tokenizer, [TWO_CALLS])
    resp = openai_client(server).chat.completions.create(
        model="m", messages=USER, tools=[CALC], parallel_tool_calls=False
    )
    assert sampler.calls[-1][2].stop == ["</tool_call>"]
    choice = resp.choices[0]
    assert _calls(choice.message) == [("calc", {"expression": "2+3"})]
    first_call = TWO_CALLS[: TWO_CALLS.index("</tool_call>") + len("</tool_call>")]
    assert choice.model_extra[semconv.RESPONSE_CHOICE_TOKEN_IDS] == tokenizer.encode(
        first_call, add_special_tokens=False
    )


@pytest.mark.parametrize(
    ("tools", "tool_choice", "param", "code"),
    [
        ([{"type": "web_search"}], None, "tools[0].type", "unsupported_tool_type"),
        ([{"type": "function", "function": {"name": "bad name!"}}], None, "tools[0].function.name", None),
        ([{"type": "function"}], None, "tools[0].function", "missing_required_parameter"),
        ([CALC, CALC], None, "tools[1]", "invalid_value"),
        ([{"type": "function", "function": {"name": "f", "parameters": []}}], None, None, "invalid_type"),
        ([CALC], {"type": "function", "function": {"name": "nope"}}, "tool_choice", "invalid_value"),
        (None, "required", "tool_choice", "invalid_value"),
        ([CALC], "sometimes", "tool_choice", "invalid_value"),
    ],
)
def test_refused_tool_definitions_get_openai_errors(
    start_server, scripted, tokenizer, openai_client, tools, tool_choice, param, code
) -> None:
    server, _ = _server(start_server, scripted, tokenizer, ["ok"])
    extra: dict[str, Any] = {}
    if tools is not None:
        extra["tools"] = tools
    if tool_choice is not None:
        extra["tool_choice"] = tool_choice
    with pytest.raises(openai.BadRequestError) as err:
        openai_client(server).chat.completions.create(model="m", messages=USER, **extra)
    body = err.value.body
    assert set(body) == {"message", "type", "param", "code"} and body["message"]
    if param is not None:
        assert body["param"] == param
    if code is not None:
        assert body["code"] == code


def test_without_a_parser_calls_stay_text(start_server, scripted, tokenizer, openai_client) -> None:
    server, _ = _server(start_server, scripted, tokenizer, [TWO_CALLS], tool_parser="none")
    client = openai_client(server)
    resp = client.chat.completions.create(model="m", messages=USER, tools=[CALC])
    assert resp.choices[0].message.content == TWO_CALLS and resp.choices[0].message.tool_calls is None
    resp = httpx.post(
        server.url + "/v1/chat/completions",
        json={"model": "m", "messages": USER, "tools": [CALC], "tool_choice": "required"},
    )
    assert resp.status_code == 400 and "--tool-parser" in resp.json()["error"]["message"]


def test_template_renders_tools_calls_and_results_the_parser_reads_back(tokenizer) -> None:
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "calc", "arguments": '{"expression": "2+3"}'},
    }
    messages = [
        {"role": "system", "content": "Be brief."},
        *USER,
        {"role": "assistant", "content": "", "tool_calls": [call, {**call, "id": "c2"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "tool", "tool_call_id": "c2", "content": "5"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=[CALC], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n<tools>\n" + json.dumps(CALC))
    assert text.count("<|im_start|>system") == 1
    assistant = text.split("<|im_start|>assistant\n")[1].split("<|im_end|>")[0]
    parsed = HermesToolParser().parse(assistant)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [
        ("calc", {"expression": "2+3"})
    ] * 2
    assert parsed.content is None and not parsed.malformed
    assert (
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n5\n</tool_response><|im_end|>"
        in text
    )
    plain = tokenizer.apply_chat_template(USER, tokenize=False, add_generation_prompt=True)
    assert plain == f"<|im_start|>user\n{USER[0]['content']}<|im_end|>\n<|im_start|>assistant\n"


def test_auto_parser_follows_the_template() -> None:
    assert make_tool_parser("auto", CHATML_TEMPLATE).name == "hermes"
    assert make_tool_parser("auto", "{{ messages }}") is None
    assert (
        make_tool_parser("auto", {"default": "{{ messages }}", "tool_use": CHATML_TEMPLATE}).name == "hermes"
    )
    assert make_tool_parser("qwen", None).name == "hermes"
    with pytest.raises(ValueError, match="unknown tool parser"):
        make_tool_parser("mistral", None)


ANSWER = {
    "type": "function",
    "function": {
        "name": "submit",
        "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}},
    },
}


def test_named_call_reads_what_small_models_write(start_server, scripted, tokenizer, openai_client) -> None:
    """A named call's arguments are its first JSON value: a bare value fills a one-parameter function,
    a number for a string parameter becomes its text; what follows is ignored; the rest is malformed."""
    replies = [
        '4}\n{"container": 1',  # SmolLM2-135M: a bare value, then whatever
        '9, "description": "the sum"}',
        '{"answer": 11, "type": "number"}}',
        '{"answer": "12"}}\n</tool_call>',
        "the answer is 4",
        '{"expression": "1"}, trailing',
    ]
    server, _ = _server(start_server, scripted, tokenizer, replies)
    client = openai_client(server)

    def named(tool: dict[str, Any]) -> Any:
        name = tool["function"]["name"]
        return client.chat.completions.create(
            model="m",
            messages=USER,
            tools=[tool, OTHER],
            tool_choice={"type": "function", "function": {"name": name}},
        ).choices[0]

    for expected in ({"answer": "4"}, {"answer": "9"}, {"answer": "11", "type": "number"}, {"answer": "12"}):
        choice = named(ANSWER)
        assert _calls(choice.message) == [("submit", expected)] and choice.finish_reason == "tool_calls"
        assert choice.message.content is None
    ids = choice.model_extra[semconv.RESPONSE_CHOICE_TOKEN_IDS]  # stopped at the closing tag
    assert ids == tokenizer.encode(replies[3], add_special_tokens=False)
    malformed = named(ANSWER)
    assert malformed.finish_reason == "malformed_tool_call" and malformed.message.tool_calls is None
    assert malformed.message.content.endswith('"arguments": the answer is 4')
    assert _calls(named(CALC).message) == [("calc", {"expression": "1"})]  # an object is taken as it is
