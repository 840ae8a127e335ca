"""``POST /v1/responses`` of the test server: the OpenAI Responses API with the token-id extension.

Non-streaming answers are a Response object; streaming answers are the events OpenAI sends
(``event: <type>`` + ``data: <json>``, each with a ``sequence_number``): ``response.created``,
``response.in_progress``, per output item ``response.output_item.added``, text parts
(``response.content_part.added``, ``response.output_text.delta``..., ``response.output_text.done``,
``response.content_part.done``) or function-call arguments (``response.function_call_arguments.delta``
..., ``.done``), ``response.output_item.done``, then ``response.completed`` (``response.incomplete``
when ``max_output_tokens`` cut the output). With ``return_token_ids`` the Response carries
``prompt_token_ids``, ``output_token_ids`` and (logprobs asked with
``include=["message.output_text.logprobs"]``) ``output_token_logprobs``; ``policy_version`` when set.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse, Response, StreamingResponse

from tinkertrace import semconv
from tinkertrace.sdk.responses_api import INCLUDE_LOGPROBS, input_messages
from tinkertrace.testing.openai_server import (
    DEFAULT_MAX_TOKENS,
    ReplyRequest,
    ToolCall,
    _error,
    _pieces,
    byte_logprob,
    render_chat,
    token_text,
)

if TYPE_CHECKING:
    from tinkertrace.testing.openai_server import OpenAITestServer


def _text_logprobs(ids: list[int], with_bytes: bool = True) -> list[dict[str, Any]]:
    """``output_text`` logprobs of ``ids`` (stream events carry them without ``bytes``)."""
    out = []
    for t in ids:
        lp: dict[str, Any] = {"token": token_text(t), "logprob": byte_logprob(t), "top_logprobs": []}
        if with_bytes:
            lp["bytes"] = [t]
        out.append(lp)
    return out


def _output_item(reply: str | ToolCall, item_id: str, text: str, ids: list[int], logprobs: bool) -> dict:
    if isinstance(reply, ToolCall):
        return {
            "type": "function_call",
            "id": item_id,
            "call_id": reply.call_id,
            "name": reply.name,
            "arguments": reply.arguments,
            "status": "completed",
        }
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    if logprobs:
        part["logprobs"] = _text_logprobs(ids)
    return {"type": "message", "id": item_id, "status": "completed", "role": "assistant", "content": [part]}


def answer(server: OpenAITestServer, body: dict[str, Any]) -> Response:
    """The answer to one Responses request (already logged and checked for injected failures)."""
    messages = input_messages(body)
    if not messages:
        return _error(400, "'input' must be a string or a non-empty list of input items")
    try:
        max_tokens = int(body.get("max_output_tokens") or DEFAULT_MAX_TOKENS)
    except (TypeError, ValueError):
        return _error(400, "max_output_tokens must be an integer")
    options = server.options
    model = str(body.get("model") or options.model)
    want_ids = bool(body.get(semconv.REQUEST_RETURN_TOKEN_IDS)) and options.token_ids
    include = body.get("include") or []
    want_logprobs = INCLUDE_LOGPROBS in include and options.logprobs
    prompt_ids = list(render_chat(messages).encode())
    if too_long := server.context_error(len(prompt_ids)):
        return too_long
    reply = options.responder(ReplyRequest("responses", model, body, messages, None, 0))
    full_text = reply.text() if isinstance(reply, ToolCall) else reply
    ids = list(full_text.encode())
    status, incomplete = "completed", None
    if len(ids) > max_tokens:
        ids, status, incomplete = ids[:max_tokens], "incomplete", {"reason": "max_output_tokens"}
    text = bytes(ids).decode(errors="ignore")
    rid, item_id = server._next_id("resp"), server._next_id("fc" if isinstance(reply, ToolCall) else "msg")
    item = _output_item(reply, item_id, text, ids, want_logprobs)
    response: dict[str, Any] = {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": status,
        "incomplete_details": incomplete,
        "error": None,
        "instructions": body.get("instructions"),
        "output": [item],
        "parallel_tool_calls": True,
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "usage": {
            "input_tokens": len(prompt_ids),
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": len(ids),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": len(prompt_ids) + len(ids),
        },
    }
    if want_ids:
        response[semconv.RESPONSES_PROMPT_TOKEN_IDS] = prompt_ids
        response[semconv.RESPONSES_OUTPUT_TOKEN_IDS] = ids
        if want_logprobs:
            response[semconv.RESPONSES_OUTPUT_LOGPROBS] = [byte_logprob(t) for t in ids]
    if options.policy_version is not None:
        response[semconv.RESPONSE_POLICY_VERSION] = options.policy_version
    if not body.get("stream"):
        return JSONResponse(response, headers=server._headers())
    events = _events(response, item, reply, text, want_logprobs, options.chunk_chars)
    return _event_stream(events, options.latency_s / 10, server._headers())


def _events(
    response: dict[str, Any],
    item: dict[str, Any],
    reply: str | ToolCall,
    text: str,
    logprobs: bool,
    chars: int,
) -> list[dict[str, Any]]:
    """The stream events of ``response`` (one output item) in OpenAI's order, numbered."""
    started = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    for key in (
        semconv.RESPONSES_PROMPT_TOKEN_IDS,
        semconv.RESPONSES_OUTPUT_TOKEN_IDS,
        semconv.RESPONSES_OUTPUT_LOGPROBS,
    ):
        started.pop(key, None)  # the token-id extension comes with the final Response only
    where = {"item_id": item["id"], "output_index": 0}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
    ]
    if isinstance(reply, ToolCall):
        events.append(
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {**item, "arguments": "", "status": "in_progress"},
            }
        )
        for piece, _ in _pieces(item["arguments"], chars):
            events.append({"type": "response.function_call_arguments.delta", **where, "delta": piece})
        events.append(
            {
                "type": "response.function_call_arguments.done",
                **where,
                "arguments": item["arguments"],
                "name": item["name"],
            }
        )
    else:
        events.append(
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {**item, "content": [], "status": "in_progress"},
            }
        )
        part = item["content"][0]
        at = {**where, "content_index": 0}
        empty = {
            "type": "output_text",
            "text": "",
            "annotations": [],
            **({"logprobs": []} if logprobs else {}),
        }
        events.append({"type": "response.content_part.added", **at, "part": empty})
        for piece, ids in _pieces(text, chars):
            delta_lps = _text_logprobs(ids, with_bytes=False)
            events.append(
                {
                    "type": "response.output_text.delta",
                    **at,
                    "delta": piece,
                    "logprobs": delta_lps if logprobs else [],
                }
            )
        done_lps = [{k: v for k, v in lp.items() if k != "bytes"} for lp in part.get("logprobs", [])]
        events.append({"type": "response.output_text.done", **at, "text": text, "logprobs": done_lps})
        events.append({"type": "response.content_part.done", **at, "part": part})
    events.append({"type": "response.output_item.done", "output_index": 0, "item": item})
    final = "response.completed" if response["status"] == "completed" else "response.incomplete"
    events.append({"type": final, "response": response})
    return [{**event, "sequence_number": n} for n, event in enumerate(events)]


def _event_stream(events: list[dict[str, Any]], delay: float, headers: dict[str, str]) -> Response:
    async def sse() -> AsyncIterator[bytes]:
        for event in events:
            if delay:
                await asyncio.sleep(delay)
            yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()

    return StreamingResponse(sse(), media_type="text/event-stream", headers=headers)
