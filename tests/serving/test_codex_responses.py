"""``/v1/responses`` as Codex CLI sends it: namespace tools, the hosted ``web_search`` tool, ``include``
values the endpoint cannot honour, a streamed answer, and a follow-up carrying ``reasoning`` and
``function_call_output`` items — through the real ``openai`` SDK over a real socket.

The backend is the hosted-Tinker double with scripted replies (the built-in tokenizer and chat
template, Hermes tool syntax), so the model's namespaced call is written exactly and its mapping
back to the namespace's form can be checked.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from tinkertrace.serving.openai_wire.responses_tools import TOOLS_LEFT_OUT
from tinkertrace.serving.policy import PolicyHolder

EVENTS = TypeAdapter(ResponseStreamEvent)
SHELL = {
    "type": "function",
    "name": "shell",
    "description": "Run a shell command.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "array", "items": {"type": "string"}}},
    },
}
PLAN = {
    "type": "function",
    "name": "update_plan",
    "description": "Update the plan.",
    "strict": False,
    "parameters": {"type": "object", "properties": {"plan": {"type": "array"}}},
}
DOCS = {  # openai.types.responses.NamespaceTool, as Codex CLI groups an MCP server's tools
    "type": "namespace",
    "name": "mcp__docs",
    "description": "Tools of the docs MCP server.",
    "tools": [
        {
            "type": "function",
            "name": "search",
            "description": "Search the docs.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
        {"type": "function", "name": "fetch", "description": "Fetch a page.", "defer_loading": False},
    ],
}
TOOLS = [
    SHELL,
    PLAN,
    {"type": "function", "name": "view_image", "parameters": {}},
    DOCS,
    {"type": "web_search"},
]
CODEX = {  # the shape of Codex CLI 0.171's first request (tools[3] is the namespace, tools[4] hosted)
    "model": "m",
    "instructions": "You are Codex, a coding agent. " * 20,
    "input": [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "<env>cwd</env>"}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "find the docs"}]},
    ],
    "tools": TOOLS,
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "0199-session",
    "text": {"verbosity": "low"},
}
NAMESPACED_CALL = '<tool_call>{"name": "mcp__docs__search", "arguments": {"query": "install"}}</tool_call>'


@pytest.fixture
def codex(start_server, scripted, tokenizer, openai_client):
    """``codex(replies, **create_app_options)`` -> (OpenAI client, sampler, server)."""

    def start(replies: list[str], **options: Any):
        sampler = scripted(replies)
        server = start_server(PolicyHolder(sampler, tokenizer, "m"), **options)
        return openai_client(server), sampler, server

    return start


def _stream(client: Any, body: dict[str, Any]) -> list[Any]:
    args = {k: v for k, v in body.items() if k not in ("stream", "prompt_cache_key", "text")}
    extra = {"prompt_cache_key": body["prompt_cache_key"], "text": body["text"]}
    with client.responses.create(**args, stream=True, extra_body=extra) as stream:
        return list(stream)


def test_codex_default_request_streams_and_its_namespaced_call_maps_back(codex, tokenizer) -> None:
    client, sampler, _ = codex([NAMESPACED_CALL])
    events = _stream(client, CODEX)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    [call] = final.output
    assert call.type == "function_call" and (call.name, call.namespace) == ("search", "mcp__docs")
    assert json.loads(call.arguments) == {"query": "install"}
    done = [e for e in events if e.type == "response.output_item.done"]
    assert done[0].item.namespace == "mcp__docs" and done[0].item.name == "search"
    prompt = tokenizer.decode(sampler.calls[0][0])
    # the namespace's functions are offered under their qualified names; the hosted tool is not offered
    assert '"name": "mcp__docs__search"' in prompt and '"name": "mcp__docs__fetch"' in prompt
    assert '"name": "shell"' in prompt and "web_search" not in prompt
    assert prompt.startswith("<|im_start|>system\nYou are Codex")
    # nothing comes back for include: ["reasoning.encrypted_content"] (no reasoning is produced)
    assert not [item for item in final.output if item.type == "reasoning"]


def test_codex_follow_up_with_reasoning_and_function_call_output_items(codex, tokenizer) -> None:
    client, sampler, _ = codex(["The docs say: pip install."])
    follow_up = {
        **CODEX,
        "input": [
            *CODEX["input"],
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": "I should look it up."}],
                "encrypted_content": "gAAAAB-opaque",
            },
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "search",
                "namespace": "mcp__docs",
                "arguments": '{"query": "install"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "pip install tinkertrace"},
        ],
    }
    events = _stream(client, follow_up)
    assert events[-1].type == "response.completed"
    assert events[-1].response.output_text == "The docs say: pip install."
    for event in events:  # every event as the openai package's own union reads it
        EVENTS.validate_python(event.model_dump(mode="json"))
    prompt = tokenizer.decode(sampler.calls[0][0])
    assert prompt.endswith(
        '<tool_call>\n{"name": "mcp__docs__search", "arguments": "{\\"query\\": \\"install\\"}"}\n'
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\npip install tinkertrace\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ) or prompt.endswith(
        '<tool_call>\n{"name": "mcp__docs__search", "arguments": {"query": "install"}}\n'
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\npip install tinkertrace\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert "look it up" not in prompt and "gAAAAB" not in prompt  # reasoning items are not replayed


def test_a_non_streamed_namespaced_call_and_a_forced_namespaced_tool_choice(codex, tokenizer) -> None:
    _, sampler, server = codex([NAMESPACED_CALL, '{"query": "install"}}</tool_call>'])
    for choice in ("auto", {"type": "function", "name": "search", "namespace": "mcp__docs"}):
        body = {**CODEX, "stream": False, "tool_choice": choice}
        answer = httpx.post(f"{server.url}/v1/responses", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        [call] = answer.json()["output"]
        assert (call["type"], call["name"], call["namespace"]) == ("function_call", "search", "mcp__docs")
        assert json.loads(call["arguments"]) == {"query": "install"}
    # the forced choice names the qualified function to the model
    assert '{"name": "mcp__docs__search", "arguments": ' in tokenizer.decode(sampler.calls[-1][0])


def test_hosted_tools_are_left_out_with_a_note_on_the_recorded_span(recording_endpoint) -> None:
    endpoint = recording_endpoint("serve", ["ok"])
    body = {**CODEX, "model": "scripted-model", "stream": False}
    body["tools"] = [*TOOLS, {"type": "file_search", "vector_store_ids": ["vs_1"]}]
    answer = httpx.post(f"{endpoint.url}/rollouts/r-codex/v1/responses", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    [(note,)] = endpoint.query(
        f"SELECT json_extract_string(attributes, '$.\"{TOOLS_LEFT_OUT}\"') FROM spans WHERE span_type = 'llm'"
    )
    assert note == "tools[4] (web_search), tools[5] (file_search)"


def test_a_malformed_namespace_is_refused_clearly(codex) -> None:
    _, _, server = codex(["ok"])
    for tool, param in (
        ({"type": "namespace", "name": "ns"}, "tools[0].tools"),
        ({"type": "namespace", "tools": []}, "tools[0].name"),
        (
            {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "a b"}]},
            "tools[0].name",
        ),
    ):
        answer = httpx.post(
            f"{server.url}/v1/responses", json={"model": "m", "input": "hi", "tools": [tool]}, timeout=30
        )
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == param, answer.text
