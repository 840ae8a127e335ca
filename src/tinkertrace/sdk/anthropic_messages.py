"""The Anthropic Messages API (``POST /v1/messages``) in the SDK's terms.

A Messages request's ``system`` and ``messages`` become chat messages (what ``gen_ai.input.messages``
records); a Message object (non-streaming), or its stream (``message_start``, ``content_block_delta``
text, ``message_delta``), becomes a :class:`~tinkertrace.sdk.response_parse.ResponseRecord` with one
choice. Token ids and logprobs come from the extension fields ``tinkertrace serve`` adds, named as on
the Responses API (``prompt_token_ids`` on the Message / ``message_start``'s message,
``output_token_ids`` and ``output_token_logprobs`` on the Message / the ``message_delta`` event).
"""

from __future__ import annotations

from typing import Any

import orjson

from tinkertrace.sdk.response_parse import ChoiceRecord, ResponseRecord
from tinkertrace.sdk.responses_api import apply_token_extension, text_of


def _tool_call(block: dict[str, Any], arguments: str | None = None) -> dict[str, Any]:
    """A ``tool_use`` block as a chat ``tool_calls`` entry (arguments: the JSON text of its input)."""
    if arguments is None:
        arguments = orjson.dumps(block.get("input") or {}).decode()
    return {
        "id": block.get("id"),
        "type": "function",
        "function": {"name": block.get("name"), "arguments": arguments},
    }


def chat_messages(body: dict[str, Any], *, strict: bool = True) -> list[dict[str, Any]]:
    """Chat messages of a Messages request: ``system`` first; ``text`` blocks as content, ``tool_use``
    blocks as the assistant's ``tool_calls``, ``tool_result`` blocks as ``tool`` messages. Other blocks
    (images, documents, thinking) raise ValueError naming the block, or are skipped unless ``strict``."""
    messages: list[dict[str, Any]] = []
    if body.get("system") is not None:
        messages.append({"role": "system", "content": text_of(body["system"])})
    for i, message in enumerate(body.get("messages") or []):
        if not isinstance(message, dict):
            continue
        role, content = message.get("role", "user"), message.get("content")
        if not isinstance(content, list):
            messages.append({"role": role, "content": content if isinstance(content, str) else ""})
            continue
        texts, calls, results = [], [], []
        for j, block in enumerate(content):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                texts.append(str(block.get("text", "")))
            elif kind == "tool_use":
                calls.append(_tool_call(block))
            elif kind == "tool_result":
                results.append(
                    {
                        "role": "tool",
                        "tool_call_id": block.get("tool_use_id"),
                        "content": text_of(block.get("content")),
                    }
                )
            elif strict:
                raise ValueError(
                    f"messages[{i}].content[{j}]: {kind or type(block).__name__!r} blocks are not served "
                    "(text, tool_use and tool_result are)"
                )
        messages.extend(results)
        if texts or calls or not results:
            entry: dict[str, Any] = {"role": role, "content": "".join(texts)}
            if calls:
                entry["tool_calls"] = calls
            messages.append(entry)
    return messages


def input_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """What ``gen_ai.input.messages`` records of a Messages request (blocks not served are left out)."""
    return chat_messages(body, strict=False)


def _usage(record: ResponseRecord, usage: Any) -> None:
    if isinstance(usage, dict):
        known = record.usage or {}
        record.usage = {
            "prompt_tokens": usage.get("input_tokens", known.get("prompt_tokens")),
            "completion_tokens": usage.get("output_tokens", known.get("completion_tokens")),
        }


def apply_message(record: ResponseRecord, message: dict[str, Any]) -> ChoiceRecord:
    """Fold a Message object (or ``message_start``'s partial one) into ``record``'s choice 0."""
    record.response_id = message.get("id") or record.response_id
    record.model = message.get("model") or record.model
    choice = record.choice(0)
    for block in message.get("content") or []:
        if block.get("type") == "text":
            choice.text.append(str(block.get("text", "")))
        elif block.get("type") == "tool_use":
            choice.tool_calls[len(choice.tool_calls)] = _tool_call(block)
    if message.get("stop_reason"):
        choice.finish_reason = str(message["stop_reason"])
    _usage(record, message.get("usage"))
    apply_token_extension(record, choice, message)
    return choice


def parse_json(body: bytes) -> ResponseRecord:
    record = ResponseRecord()
    apply_message(record, orjson.loads(body))
    return record


def parse_sse(body: bytes) -> ResponseRecord:
    """A Messages event stream, reassembled (a stream left before its end keeps the text it had)."""
    record = ResponseRecord()
    choice = record.choice(0)
    calls: dict[int, int] = {}  # content block index -> tool call number
    for line in body.splitlines():
        if not line.startswith(b"data:"):
            continue
        event = orjson.loads(line[5:])
        kind = event.get("type")
        if kind == "message_start":
            apply_message(record, event.get("message") or {})
        elif kind == "content_block_start" and (event.get("content_block") or {}).get("type") == "tool_use":
            calls[event.get("index", 0)] = len(choice.tool_calls)
            choice.tool_calls[len(choice.tool_calls)] = _tool_call(event["content_block"], arguments="")
        elif kind == "content_block_delta":
            delta = event.get("delta") or {}
            if delta.get("type") == "text_delta":
                choice.text.append(str(delta.get("text", "")))
            elif delta.get("type") == "input_json_delta" and event.get("index", 0) in calls:
                call = choice.tool_calls[calls[event.get("index", 0)]]
                call["function"]["arguments"] += str(delta.get("partial_json", ""))
        elif kind == "message_delta":
            if (event.get("delta") or {}).get("stop_reason"):
                choice.finish_reason = str(event["delta"]["stop_reason"])
            _usage(record, event.get("usage"))
            apply_token_extension(record, choice, event)
    return record
