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


def input_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Chat messages of a Messages request: ``system`` first, then each message's text."""
    messages: list[dict[str, Any]] = []
    if body.get("system") is not None:
        messages.append({"role": "system", "content": text_of(body["system"])})
    for message in body.get("messages") or []:
        if isinstance(message, dict):
            messages.append({"role": message.get("role", "user"), "content": text_of(message.get("content"))})
    return messages


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
    choice.text.append(text_of([b for b in message.get("content") or [] if b.get("type") == "text"]))
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
    for line in body.splitlines():
        if not line.startswith(b"data:"):
            continue
        event = orjson.loads(line[5:])
        kind = event.get("type")
        if kind == "message_start":
            apply_message(record, event.get("message") or {})
        elif kind == "content_block_delta" and (event.get("delta") or {}).get("type") == "text_delta":
            choice.text.append(str(event["delta"].get("text", "")))
        elif kind == "message_delta":
            if (event.get("delta") or {}).get("stop_reason"):
                choice.finish_reason = str(event["delta"]["stop_reason"])
            _usage(record, event.get("usage"))
            apply_token_extension(record, choice, event)
    return record
