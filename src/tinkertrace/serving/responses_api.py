"""The OpenAI Responses API (``POST /v1/responses``) on the sampling endpoint.

A request's ``instructions`` and ``input`` items (messages, ``function_call`` and
``function_call_output``) become chat messages rendered by the model's chat template; the sampled
reply becomes output items: a ``message`` with its ``output_text`` and one ``function_call`` per
parsed tool call. Response objects and stream events are built and checked with the ``openai``
package's own types, then carry the token-id extension of :mod:`tinkertrace.semconv`: top-level
``prompt_token_ids``, ``output_token_ids`` (every sampled token, tool-call tokens included),
``output_token_logprobs`` (when ``include`` asks for ``message.output_text.logprobs``) and
``policy_version``.

``previous_response_id`` continues a conversation this server answered: stored replies
(``store``, true by default) are kept in memory, the last :data:`STORED_RESPONSES` of them.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from openai.types.responses import Response

from tinkertrace import semconv
from tinkertrace.serving import openai_protocol as proto
from tinkertrace.serving.openai_protocol import ApiError, Choice, SamplingOptions, ToolChoice

INCLUDE_LOGPROBS = "message.output_text.logprobs"
STORED_RESPONSES = 4096
TEXT_PART_TYPES = ("input_text", "output_text", "text")
INPUT_ROLES = ("user", "system", "developer", "assistant")


@dataclass(frozen=True)
class ResponsesRequest:
    """A validated ``/v1/responses`` body."""

    model: str
    instructions: str | None
    messages: list[dict[str, Any]]  # the input items as chat messages (without the instructions)
    options: SamplingOptions
    tools: list[dict[str, Any]] | None  # chat form, for the template and the tool plan
    tool_choice: ToolChoice
    previous_response_id: str | None
    store: bool
    metadata: dict[str, str] | None


def _part_text(part: Any, param: str) -> str:
    if not isinstance(part, dict):
        raise proto._invalid_type(param, "an object", part)
    kind = part.get("type")
    if kind in TEXT_PART_TYPES and isinstance(part.get("text"), str):
        return part["text"]
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return part["refusal"]
    raise ApiError(
        400,
        f"Invalid value for '{param}.type': content part type {kind!r} is not supported by this server; "
        "only text parts are.",
        param=f"{param}.type",
        code="unsupported",
    )


def _text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_part_text(p, f"{param}[{i}]") for i, p in enumerate(content))
    raise proto._invalid_type(param, "a string or an array of content parts", content)


def _string(item: dict[str, Any], key: str, param: str) -> str:
    value = item.get(key)
    if value is None:
        raise proto._missing(f"{param}.{key}")
    if not isinstance(value, str):
        raise proto._invalid_type(f"{param}.{key}", "a string", value)
    return value


def input_messages(value: Any) -> list[dict[str, Any]]:
    """``input`` as chat messages: a string is one user message; items are messages, function calls
    (joined onto the assistant message before them, as the template renders a reply with calls) and
    function call outputs (``tool`` messages). Reasoning items are skipped; other items are refused."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise proto._invalid_type("input", "a string or an array of input items", value)
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise proto._invalid_type(param, "an object", item)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in INPUT_ROLES:
                raise proto._invalid_value(f"{param}.role", f"{role!r} is not one of {list(INPUT_ROLES)}.")
            messages.append({"role": role, "content": _text(item.get("content"), f"{param}.content")})
        elif kind == "function_call":
            call = {
                "id": _string(item, "call_id", param),
                "type": "function",
                "function": {
                    "name": _string(item, "name", param),
                    "arguments": _string(item, "arguments", param),
                },
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = _text(item.get("output"), f"{param}.output")
            messages.append(
                {"role": "tool", "tool_call_id": _string(item, "call_id", param), "content": output}
            )
        elif kind != "reasoning":
            raise ApiError(
                400,
                f"Invalid value for '{param}.type': input item type {kind!r} is not supported by this "
                "server; use message, function_call or function_call_output items.",
                param=f"{param}.type",
                code="unsupported",
            )
    if not messages:
        raise proto._invalid_value("input", "expected at least one message or function call output.")
    return messages


def _include_logprobs(body: dict[str, Any]) -> bool:
    include = body.get("include")
    if include is None:
        return False
    if not isinstance(include, list) or not all(isinstance(x, str) for x in include):
        raise proto._invalid_type("include", "an array of strings", include)
    return INCLUDE_LOGPROBS in include


def parse_request(body: Any) -> ResponsesRequest:
    """Validate a ``/v1/responses`` body; raises :class:`ApiError`."""
    body = proto._require_object(body)
    model = proto._model(body)
    if body.get("input") is None:
        raise proto._missing("input")
    messages = input_messages(body["input"])
    logprobs = _include_logprobs(body)
    top = proto._field(body, "top_logprobs", int, 0, minimum=0, maximum=proto.MAX_TOP_LOGPROBS_CHAT)
    tools = proto.function_tools(body.get("tools"), nested=False)
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise proto._invalid_type("metadata", "an object", metadata)
    options = SamplingOptions(
        n=1,
        max_tokens=proto._field(body, "max_output_tokens", int, minimum=1),
        temperature=proto._field(body, "temperature", float, 1.0, minimum=0.0, maximum=2.0),
        top_p=proto._field(body, "top_p", float, 1.0, minimum=0.0, maximum=1.0),
        top_k=-1,
        seed=None,
        stop=(),
        logprobs=logprobs,
        top_logprobs=top if logprobs else 0,
        stream=bool(proto._field(body, "stream", bool, False)),
        include_usage=False,
    )
    return ResponsesRequest(
        model=model,
        instructions=proto._field(body, "instructions", str),
        messages=messages,
        options=options,
        tools=tools,
        tool_choice=proto.tool_choice(body, tools, named=lambda c: c.get("name")),
        previous_response_id=proto._field(body, "previous_response_id", str),
        store=bool(proto._field(body, "store", bool, True)),
        metadata=metadata,
    )


class ConversationStore:
    """The chat messages of the last ``capacity`` stored responses, by response id."""

    def __init__(self, capacity: int = STORED_RESPONSES) -> None:
        self.capacity = capacity
        self._conversations: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    def history(self, response_id: str | None) -> list[dict[str, Any]]:
        """The conversation up to and including ``response_id``'s reply; 400 for an unknown id."""
        if response_id is None:
            return []
        if response_id not in self._conversations:
            raise ApiError(
                400,
                f"Previous response with id '{response_id}' not found: this server keeps the last "
                f"{self.capacity} stored responses in memory (send the whole input instead).",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        return self._conversations[response_id]

    def put(self, response_id: str, messages: list[dict[str, Any]]) -> None:
        self._conversations[response_id] = messages
        while len(self._conversations) > self.capacity:
            self._conversations.popitem(last=False)


def new_item_id(prefix: str) -> str:
    """An id in OpenAI's Responses style (``resp_...``, ``msg_...``, ``fc_...``)."""
    return f"{prefix}_{uuid.uuid4().hex}"


def assistant_message(choice: Choice) -> dict[str, Any]:
    """The reply as a chat message (what a later turn's template renders)."""
    message: dict[str, Any] = {"role": "assistant", "content": choice.text}
    if choice.tool_calls:
        message["tool_calls"] = [call.as_openai() for call in choice.tool_calls]
    return message


# --- Response objects ---------------------------------------------------------------------------------
def _logprobs(choice: Choice) -> list[dict[str, Any]]:
    tops = choice.top_logprobs or [[] for _ in choice.token_texts or []]
    return [
        {
            "token": text,
            "bytes": list(text.encode()),
            "logprob": lp,
            "top_logprobs": [{"token": t, "bytes": list(t.encode()), "logprob": v} for t, v in top],
        }
        for text, lp, top in zip(choice.token_texts or [], choice.logprobs or [], tops, strict=True)
    ]


def _output(choice: Choice, status: str, logprobs: bool) -> list[dict[str, Any]]:
    """Output items: the text as a message (when there is text, or no call), then the calls.
    ``output_text.logprobs`` are per sampled token when the output is text only (empty otherwise:
    ``output_token_logprobs`` is always aligned with ``output_token_ids``)."""
    items: list[dict[str, Any]] = []
    if choice.text or not choice.tool_calls:
        part: dict[str, Any] = {"type": "output_text", "text": choice.text, "annotations": []}
        if logprobs:
            part["logprobs"] = [] if choice.tool_calls else _logprobs(choice)
        items.append(
            {
                "type": "message",
                "id": new_item_id("msg"),
                "role": "assistant",
                "status": status,
                "content": [part],
            }
        )
    for call in choice.tool_calls:
        items.append(
            {
                "type": "function_call",
                "id": new_item_id("fc"),
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments,
                "status": "completed",
            }
        )
    return items


def _echo_tool_choice(choice: ToolChoice) -> Any:
    return {"type": "function", "name": choice.name} if choice.mode == "function" else choice.mode


def response_body(rid: str, req: ResponsesRequest, version: int, choice: Choice) -> dict[str, Any]:
    """The Response object (checked against ``openai.types.responses.Response``) with the token-id
    extension and the policy version."""
    incomplete = choice.finish_reason == "length"
    status = "incomplete" if incomplete else "completed"
    prompt_tokens, output_tokens = len(choice.prompt_token_ids), len(choice.token_ids)
    fields = {
        "id": rid,
        "object": "response",
        "created_at": int(time.time()),
        "model": req.model,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": req.instructions,
        "output": _output(choice, status, req.options.logprobs),
        "tools": [{**t["function"], "type": "function", "strict": False} for t in req.tools or []],
        "tool_choice": _echo_tool_choice(req.tool_choice),
        "parallel_tool_calls": req.tool_choice.parallel,
        "temperature": req.options.temperature,
        "top_p": req.options.top_p,
        "max_output_tokens": req.options.max_tokens,
        "previous_response_id": req.previous_response_id,
        "store": req.store,
        "metadata": req.metadata or {},
        "text": {"format": {"type": "text"}},
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + output_tokens,
        },
    }
    body = Response.model_validate(fields).model_dump(mode="json", exclude_unset=True)
    body[semconv.RESPONSES_PROMPT_TOKEN_IDS] = choice.prompt_token_ids
    body[semconv.RESPONSES_OUTPUT_TOKEN_IDS] = choice.token_ids
    if req.options.logprobs and choice.logprobs is not None:
        body[semconv.RESPONSES_OUTPUT_LOGPROBS] = choice.logprobs
    body[semconv.RESPONSE_POLICY_VERSION] = version
    return body
