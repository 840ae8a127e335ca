"""OpenInference (Phoenix, ``openinference-instrumentation-*``): ``openinference.span.kind = LLM``.

The span carries the request JSON in ``input.value`` and the whole response JSON in ``output.value``,
so the server's exact token ids are there whenever it returned them (vLLM's ``prompt_token_ids`` and
``choices[].token_ids``; ``tinkertrace serve`` always does). The model is ``llm.model_name``; messages
are also flattened into ``llm.input_messages.N.message.*`` / ``llm.output_messages.N.message.*``.
Agent spans carry ``agent.name``.
"""

from __future__ import annotations

import json
from typing import Any

from tinkertrace import semconv as sc
from tinkertrace.builder.adapters.base import Adapter, Conversation
from tinkertrace.spanstore.sql import attr

KIND = "openinference.span.kind"
INPUT_VALUE = "input.value"
OUTPUT_VALUE = "output.value"
MODEL = "llm.model_name"

_OUT = attr(OUTPUT_VALUE)
_VALID = f"json_valid({_OUT})"
PROMPT_IDS = f"CASE WHEN {_VALID} THEN TRY_CAST(json_extract({_OUT}, '$.prompt_token_ids') AS INTEGER[]) END"
RESPONSE_IDS = (
    f"CASE WHEN {_VALID} THEN TRY_CAST(json_extract({_OUT}, '$.choices[0].token_ids') AS INTEGER[]) END"
)
LOGPROBS = (
    f"CASE WHEN {_VALID} THEN "
    f"TRY_CAST(json_extract({_OUT}, '$.choices[0].logprobs.content[*].logprob') AS FLOAT[]) END"
)


def _flattened(attributes: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    """``llm.output_messages.N.message.{role,content,tool_calls.M.tool_call.*}`` as chat messages."""
    found: dict[int, dict[str, Any]] = {}
    for key, value in attributes.items():
        if not key.startswith(prefix):
            continue
        index, _, rest = key[len(prefix) :].partition(".message.")
        if not index.isdigit():
            continue
        message = found.setdefault(int(index), {"role": "assistant", "content": None})
        if rest in ("role", "content"):
            message[rest] = value
        elif rest.startswith("tool_calls."):
            n, _, field = rest[len("tool_calls.") :].partition(".tool_call.")
            calls = message.setdefault("tool_calls", {})
            call = calls.setdefault(int(n), {"type": "function", "function": {}})
            if field == "id":
                call["id"] = value
            elif field.startswith("function."):
                call["function"][field[len("function.") :]] = value
    messages = [found[i] for i in sorted(found)]
    for message in messages:
        if "tool_calls" in message:
            message["tool_calls"] = [message["tool_calls"][i] for i in sorted(message["tool_calls"])]
    return messages


def conversation(attributes: dict[str, Any]) -> Conversation | None:
    """The request's messages and tools from ``input.value``; the answer from ``output.value``'s first
    choice, else from the flattened output messages (a streamed call)."""
    try:
        request = json.loads(attributes.get(INPUT_VALUE) or "")
    except ValueError:
        return None
    if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
        return None
    output: dict[str, Any] | None = None
    try:
        response = json.loads(attributes.get(OUTPUT_VALUE) or "")
        output = response["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        flattened = _flattened(attributes, "llm.output_messages.")
        output = flattened[0] if flattened else None
    if not isinstance(output, dict):
        return None
    return Conversation(request["messages"], output, request.get("tools"))


ADAPTER = Adapter(
    name="openinference",
    match=f"({attr(KIND)} = 'LLM')",
    columns={
        "span_type": f"'{sc.TYPE_LLM}'",
        "model": attr(MODEL),
        "response_id": f"CASE WHEN {_VALID} THEN json_extract_string({_OUT}, '$.id') END",
        "prompt_token_ids": PROMPT_IDS,
        "response_token_ids": RESPONSE_IDS,
        "response_logprobs": LOGPROBS,
        "token_source": f"CASE WHEN ({PROMPT_IDS}) IS NOT NULL THEN '{sc.SOURCE_SERVER}' END",
    },
    conversation=conversation,
    agent_name=attr(sc.FOREIGN_AGENT_NAME),
)
