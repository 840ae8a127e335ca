"""openai-v2's per-message log events (its default mode) as a conversation to re-tokenise: the bodies
as that package writes them (``utils.message_to_event`` / ``choice_to_event``, 2.4b0), joined to their
span in emission order. The real package's events are tested end to end in tests/instrumentations."""

from __future__ import annotations

import json

from tinkertrace.builder.adapters.genai import MESSAGE_EVENTS, conversation


def event(name: str, body: dict | None) -> dict:
    return {"name": name, "body": None if body is None else json.dumps(body)}


CALL = {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"x": 1}'}}


def test_message_events_in_order_become_the_prompt_and_the_first_choice_the_answer() -> None:
    events = [
        event("gen_ai.system.message", {"content": "Be brief."}),
        event("gen_ai.user.message", {"content": "What is 1 + 1?"}),
        event("gen_ai.assistant.message", {"tool_calls": [CALL]}),
        event("gen_ai.tool.message", {"content": "2", "id": "call_1"}),
        event("gen_ai.choice", {"index": 1, "finish_reason": "stop", "message": {"content": "Two!"}}),
        event("gen_ai.choice", {"index": 0, "finish_reason": "stop", "message": {"content": "2."}}),
        event("gen_ai.evaluation.result", None),  # not a message: ignored
    ]
    found = conversation({"gen_ai.operation.name": "chat", MESSAGE_EVENTS: events})
    assert found is not None
    assert found.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 1 + 1?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "content": "2", "tool_call_id": "call_1"},
    ]
    assert found.output == {"role": "assistant", "content": "2."}
    assert found.tools is None  # this mode records no tool definitions


def test_a_tool_call_answer_keeps_its_calls() -> None:
    events = [
        event("gen_ai.user.message", {"content": "Use the tool."}),
        event("gen_ai.choice", {"index": 0, "finish_reason": "tool_calls",
                                "message": {"role": "assistant", "tool_calls": [CALL]}}),
    ]  # fmt: skip
    found = conversation({MESSAGE_EVENTS: events})
    assert found is not None and found.output == {"role": "assistant", "content": "", "tool_calls": [CALL]}


def test_events_without_content_give_no_conversation() -> None:
    """Content capture off: the messages' bodies are empty and the choice has no message text."""
    events = [
        event("gen_ai.user.message", None),
        event("gen_ai.choice", {"index": 0, "finish_reason": "stop", "message": {"role": "assistant"}}),
    ]
    assert conversation({MESSAGE_EVENTS: events}) is None
    no_choice = [event("gen_ai.user.message", {"content": "Hi"})]
    assert conversation({MESSAGE_EVENTS: no_choice}) is None


def test_the_parts_form_on_the_span_wins_over_events() -> None:
    attributes = {
        "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "A"}]}]),
        "gen_ai.output.messages": json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": "B"}]}]
        ),
        MESSAGE_EVENTS: [event("gen_ai.user.message", {"content": "other"})],
    }
    found = conversation(attributes)
    assert found is not None and found.messages == [{"role": "user", "content": "A"}]
