"""The Anthropic Messages API (``POST /v1/messages``) on the endpoint: the wire format only.

A Messages request becomes the chat request body the endpoint already serves (:func:`chat_body`,
validated then by :func:`~tinkertrace.serving.openai_wire.requests.parse_chat_request`); a sampled
choice becomes a Message object (:func:`message_body`) or its event stream (:func:`stream_events`).
Every answer carries the token-id extension of ``/v1/responses`` (``prompt_token_ids``,
``output_token_ids``, ``output_token_logprobs``) and ``policy_version``: on the Message, and in a
stream on ``message_start``'s message (prompt ids) and on the ``message_delta`` event (output ids).
Text content only: tool use (``tools``, ``tool_use`` / ``tool_result`` blocks) and images are refused
with a 400 naming the field.
"""

from __future__ import annotations

from typing import Any

from tinkertrace import semconv
from tinkertrace.serving.openai_wire.completions import Choice
from tinkertrace.serving.openai_wire.errors import invalid_type, invalid_value, missing, require_object

ROLES = ("user", "assistant")
# chat finish reasons -> Anthropic stop reasons
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


def _text(content: Any, param: str) -> str:
    """A string, or the text of a list of ``text`` blocks; 400 for any other block."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid_type(param, "a string or an array of content blocks", content)
    parts = []
    for i, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text" or not isinstance(block.get("text"), str):
            raise invalid_value(
                f"{param}[{i}]",
                f"only text blocks are served on /v1/messages, got {kind or type(block).__name__!r}.",
                code="unsupported",
            )
        parts.append(block["text"])
    return "".join(parts)


def chat_body(body: Any) -> dict[str, Any]:
    """The chat completions body of a Messages request (raises :class:`ApiError` for a bad one)."""
    body = require_object(body)
    if body.get("max_tokens") is None:
        raise missing("max_tokens")
    if body.get("tools"):
        raise invalid_value("tools", "tool use is not served on /v1/messages yet.", code="unsupported")
    messages = []
    if body.get("system") is not None:
        messages.append({"role": "system", "content": _text(body["system"], "system")})
    given = body.get("messages")
    if not isinstance(given, list) or not given:
        raise invalid_type("messages", "a non-empty array of messages", given)
    for i, message in enumerate(given):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise invalid_value(f"messages[{i}]", "expected an object with role 'user' or 'assistant'.")
        messages.append({"role": message["role"], "content": _text(message.get("content"), f"messages[{i}]")})
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages, "logprobs": True}
    for key in ("max_tokens", "temperature", "top_p", "top_k", "stream"):
        if key in body:
            chat[key] = body[key]
    if body.get("stop_sequences") is not None:
        chat["stop"] = body["stop_sequences"]
    return chat


def message_body(rid: str, model: str, choice: Choice, version: int) -> dict[str, Any]:
    """The Message object answering with ``choice``."""
    return {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": choice.text}],
        "stop_reason": STOP_REASONS.get(choice.finish_reason, "end_turn"),
        "stop_sequence": None,
        "usage": {"input_tokens": len(choice.prompt_token_ids), "output_tokens": len(choice.token_ids)},
        semconv.RESPONSES_PROMPT_TOKEN_IDS: choice.prompt_token_ids,
        semconv.RESPONSES_OUTPUT_TOKEN_IDS: choice.token_ids,
        semconv.RESPONSES_OUTPUT_LOGPROBS: choice.logprobs or [],
        semconv.RESPONSE_POLICY_VERSION: version,
    }


def stream_events(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The Message as Anthropic's stream events (each event's name is its ``type``)."""
    output_keys = (semconv.RESPONSES_OUTPUT_TOKEN_IDS, semconv.RESPONSES_OUTPUT_LOGPROBS)
    start = {k: v for k, v in message.items() if k not in output_keys}
    start.update(content=[], stop_reason=None, usage={**message["usage"], "output_tokens": 0})
    text = message["content"][0]["text"]
    return [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": message["usage"]["output_tokens"]},
            **{k: message[k] for k in (*output_keys, semconv.RESPONSE_POLICY_VERSION)},
        },
        {"type": "message_stop"},
    ]


def message_id(chat_id: str) -> str:
    """A Message id (``msg_...``) from a chat completion id."""
    return "msg_" + chat_id.split("-", 1)[-1]
