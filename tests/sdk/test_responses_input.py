"""One Responses-input conversion: lenient for what the SDK records, strict for what the endpoint serves."""

from __future__ import annotations

import pytest

from tinkertrace.sdk.responses_api import InputError, input_items, input_messages

WELL_FORMED = [
    {"role": "user", "content": [{"type": "input_text", "text": "2+2?"}]},
    {"type": "reasoning", "summary": []},
    {"role": "assistant", "content": [{"type": "output_text", "text": "Let me add."}]},
    {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a":2,"b":2}'},
    {"type": "function_call", "call_id": "c2", "name": "check", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "4"},
    {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "ok"}]},
]


def test_strict_and_lenient_agree_on_well_formed_input() -> None:
    strict = input_items(WELL_FORMED, strict=True)
    assert strict == input_items(WELL_FORMED)
    assert strict == [
        {"role": "user", "content": "2+2?"},
        {
            "role": "assistant",
            "content": "Let me add.",  # the calls join the reply they belong to
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a":2,"b":2}'}},
                {"id": "c2", "type": "function", "function": {"name": "check", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "4"},
        {"role": "tool", "tool_call_id": "c2", "content": "ok"},
    ]
    body = {"instructions": "Be brief.", "input": "hi"}
    assert input_messages(body) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]


@pytest.mark.parametrize(
    ("bad", "kind", "param"),
    [
        (42, "type", "input"),
        (["text"], "type", "input[0]"),
        ([{"role": "robot", "content": "hi"}], "value", "input[0].role"),
        (
            [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}],
            "value",
            "input[0].content[0].type",
        ),
        ([{"type": "function_call", "call_id": "c1", "name": "add"}], "missing", "input[0].arguments"),
        ([{"type": "function_call_output", "call_id": 7, "output": "4"}], "type", "input[0].call_id"),
        ([{"type": "web_search_call"}], "value", "input[0].type"),
        ([{"type": "reasoning"}], "value", "input"),
    ],
)
def test_strict_refuses_what_lenient_leaves_out(bad: object, kind: str, param: str) -> None:
    with pytest.raises(InputError) as refused:
        input_items(bad, strict=True)
    assert (refused.value.kind, refused.value.param) == (kind, param)
    input_items(bad)  # the SDK records what it can of the same input, and never raises
