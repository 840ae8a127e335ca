"""The Anthropic Messages API (``POST /v1/messages``) on the endpoint: the wire format only.

A Messages request becomes the chat request body the endpoint already serves (:func:`chat_body`,
validated then by :func:`~tinkertrace.serving.openai_wire.requests.parse_chat_request`); a sampled
choice becomes a Message object (:func:`message_body`) or its event stream (:func:`stream_events`).
Every answer carries the token-id extension of ``/v1/responses`` (``prompt_token_ids``,
``output_token_ids``, ``output_token_logprobs``) and ``policy_version``: on the Message, and in a
stream on ``message_start``'s message (prompt ids) and on the ``message_delta`` event (output ids).
Text and tool use: ``tools`` become function tools, ``tool_use`` / ``tool_result`` blocks the chat
tool calls and tool messages (:func:`tinkertrace.sdk.anthropic_messages.chat_messages`), and calls
parsed from the reply come back as ``tool_use`` blocks (``stop_reason: tool_use``). Images and
documents are refused with a 400 naming the block.

Accepted as the upstream API accepts them (what Claude Code sends in its default mode):

- ``system`` messages anywhere in ``messages``: rendered as a system turn at their place; where the
  chat template refuses a system turn there, appended in order to the top-level ``system``
  (:func:`merged_system`, tried by :mod:`tinkertrace.serving.anthropic_route`).
- ``thinking`` / ``redacted_thinking`` blocks in the history: dropped from the prompt (the served
  model never wrote them: this endpoint answers without thinking blocks, as a model without
  extended thinking does).
- ``thinking``, ``context_management``, ``output_config``, ``metadata``, ``service_tier``,
  ``cache_control`` (on blocks, ``system`` blocks and tools) and other fields the endpoint cannot
  honour: ignored. ``tool_result``'s ``is_error`` is accepted; its content (a string or a list of
  text blocks) is the tool message's text.
"""

from __future__ import annotations

import json
from typing import Any

from tinkertrace import semconv
from tinkertrace.sdk import anthropic_messages
from tinkertrace.serving.openai_wire.completions import Choice
from tinkertrace.serving.openai_wire.errors import (
    ApiError,
    invalid_type,
    invalid_value,
    missing,
    require_object,
)

ROLES = ("user", "assistant", "system")
DROPPED_BLOCKS = frozenset({"thinking", "redacted_thinking"})
# chat finish reasons -> Anthropic stop reasons
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _tools(tools: Any) -> list[dict[str, Any]]:
    """Anthropic tools (``name``, ``description``, ``input_schema``) as chat function tools."""
    if not isinstance(tools, list):
        raise invalid_type("tools", "an array of tools", tools)
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise invalid_value(f"tools[{i}]", "expected an object with a string 'name'.")
        function = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    """Anthropic's ``tool_choice`` (``auto``, ``any``, ``tool`` + name, ``none``) in chat terms."""
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind or "")
    if mapped is None:
        raise invalid_value("tool_choice", "expected {'type': 'auto' | 'any' | 'tool' | 'none'}.")
    return mapped


def _served(message: dict[str, Any]) -> dict[str, Any]:
    """``message`` without the blocks left out of the prompt (thinking)."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    kept = [b for b in content if not (isinstance(b, dict) and b.get("type") in DROPPED_BLOCKS)]
    return {**message, "content": kept}


def merged_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with every system message folded, in order, into one leading system message
    (blank-line separated): for chat templates that allow a system turn only first."""
    system = [str(m.get("content") or "") for m in messages if m.get("role") == "system"]
    rest = [m for m in messages if m.get("role") != "system"]
    return [{"role": "system", "content": "\n\n".join(s for s in system if s)}, *rest] if system else rest


def chat_body(body: Any) -> dict[str, Any]:
    """The chat completions body of a Messages request (raises :class:`ApiError` for a bad one)."""
    body = require_object(body)
    if body.get("max_tokens") is None:
        raise missing("max_tokens")
    given = body.get("messages")
    if not isinstance(given, list) or not given:
        raise invalid_type("messages", "a non-empty array of messages", given)
    for i, message in enumerate(given):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise invalid_value(
                f"messages[{i}]", "expected an object with role 'user', 'assistant' or 'system'."
            )
    try:
        messages = anthropic_messages.chat_messages({**body, "messages": [_served(m) for m in given]})
    except ValueError as exc:
        raise invalid_value("messages", f"{exc}.", code="unsupported") from exc
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages, "logprobs": True}
    for key in ("max_tokens", "temperature", "top_p", "top_k", "stream"):
        if key in body:
            chat[key] = body[key]
    if body.get("stop_sequences") is not None:
        chat["stop"] = body["stop_sequences"]
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
        if isinstance(body["tool_choice"], dict) and body["tool_choice"].get("disable_parallel_tool_use"):
            chat["parallel_tool_calls"] = False
    return chat


def _content(choice: Choice) -> list[dict[str, Any]]:
    """The answer's content blocks: its text, then a ``tool_use`` block per parsed call."""
    blocks: list[dict[str, Any]] = [{"type": "text", "text": choice.text}] if choice.text else []
    for call in choice.tool_calls:
        try:
            arguments = json.loads(call.arguments or "{}")
        except json.JSONDecodeError:
            arguments = {}
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": arguments})
    return blocks or [{"type": "text", "text": ""}]


def message_body(rid: str, model: str, choice: Choice, version: int) -> dict[str, Any]:
    """The Message object answering with ``choice`` (sampled by policy ``version`` where the choice
    does not name its tokens' versions)."""
    return {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _content(choice),
        "stop_reason": STOP_REASONS.get(choice.finish_reason, "end_turn"),
        "stop_sequence": None,
        "usage": {"input_tokens": len(choice.prompt_token_ids), "output_tokens": len(choice.token_ids)},
        semconv.RESPONSES_PROMPT_TOKEN_IDS: choice.prompt_token_ids,
        semconv.RESPONSES_OUTPUT_TOKEN_IDS: choice.token_ids,
        semconv.RESPONSES_OUTPUT_LOGPROBS: choice.logprobs or [],
        **choice.version_fields(version),
    }


def _block_events(index: int, block: dict[str, Any]) -> list[dict[str, Any]]:
    """One content block as its start, delta and stop events."""
    start: dict[str, Any]
    if block["type"] == "text":
        start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
    else:
        start = {**block, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
    return [
        {"type": "content_block_start", "index": index, "content_block": start},
        {"type": "content_block_delta", "index": index, "delta": delta},
        {"type": "content_block_stop", "index": index},
    ]


_VERSION_KEYS = (semconv.RESPONSE_POLICY_VERSION, semconv.RESPONSE_POLICY_VERSION_RUNS)


def stream_events(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The Message as Anthropic's stream events (each event's name is its ``type``)."""
    output_keys = (semconv.RESPONSES_OUTPUT_TOKEN_IDS, semconv.RESPONSES_OUTPUT_LOGPROBS)
    start = {k: v for k, v in message.items() if k not in output_keys}
    start.update(content=[], stop_reason=None, usage={**message["usage"], "output_tokens": 0})
    blocks = [e for i, block in enumerate(message["content"]) for e in _block_events(i, block)]
    return [
        {"type": "message_start", "message": start},
        *blocks,
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": message["usage"]["output_tokens"]},
            **{k: message[k] for k in (*output_keys, *_VERSION_KEYS) if k in message},
        },
        {"type": "message_stop"},
    ]


def prompt_too_long(prompt_tokens: int, limit: int) -> ApiError:
    """Anthropic's own answer to a prompt beyond the context (HTTP 400 ``invalid_request_error``,
    ``prompt is too long: N tokens > M maximum``), the words Claude Code reads to compact its history.
    M is the longest prompt that leaves room for one output token in the ``limit``-token context."""
    return ApiError(
        400, f"prompt is too long: {prompt_tokens} tokens > {limit - 1} maximum", param="messages"
    )


def message_id(chat_id: str) -> str:
    """A Message id (``msg_...``) from a chat completion id."""
    return "msg_" + chat_id.split("-", 1)[-1]
