"""The OpenAI Responses API (``POST /v1/responses``): the request and the Response object.

A request's ``input`` items (messages, ``function_call`` and ``function_call_output``; ``reasoning``
items are skipped) become chat messages for the model's chat template; its ``tools`` are read by
:mod:`.responses_tools` (functions, ``namespace`` tools under qualified names, hosted tools left
out); a sampled :class:`~.completions.Choice` becomes output items: a ``message`` with its
``output_text`` and one ``function_call`` per parsed tool call (a namespaced function's with its
``namespace``). ``include`` values other than ``message.output_text.logprobs`` (e.g.
``reasoning.encrypted_content``) are accepted and return nothing: no reasoning is produced. The
Response is built and checked with the ``openai`` package's own type, then carries the token-id
extension of :mod:`tinkertrace.semconv` (top-level ``prompt_token_ids``, ``output_token_ids``
with every sampled token, tool-call tokens included, and ``output_token_logprobs`` when
``include`` asks for ``message.output_text.logprobs``).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from tinkertrace import semconv
from tinkertrace.sdk import responses_api
from tinkertrace.serving.openai_wire.completions import Choice, token_logprobs
from tinkertrace.serving.openai_wire.errors import (
    checked,
    invalid_type,
    invalid_value,
    missing,
    require_object,
)
from tinkertrace.serving.openai_wire.requests import MAX_TOP_LOGPROBS_CHAT, SamplingOptions, model_name
from tinkertrace.serving.openai_wire.responses_tools import (
    NO_TOOLS,
    ResponsesTools,
    chosen_name,
    qualify_input,
    responses_tools,
)
from tinkertrace.serving.openai_wire.tools import ToolChoice, tool_choice


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
    names: ResponsesTools = NO_TOOLS  # namespaced functions, tools left out

    @property
    def left_out(self) -> tuple[str, ...]:
        return self.names.left_out


def input_messages(value: Any) -> list[dict[str, Any]]:
    """``input`` as chat messages (:func:`tinkertrace.sdk.responses_api.input_items`, strict); what it
    refuses is answered 400 in OpenAI's shape."""
    try:
        return responses_api.input_items(value, strict=True)
    except responses_api.InputError as exc:
        if exc.kind == "type":
            raise invalid_type(exc.param, exc.detail, exc.value) from None
        if exc.kind == "missing":
            raise missing(exc.param) from None
        raise invalid_value(exc.param, exc.detail, code=exc.code) from None


def _include_logprobs(body: dict[str, Any]) -> bool:
    include = body.get("include")
    if include is None:
        return False
    if not isinstance(include, list) or not all(isinstance(x, str) for x in include):
        raise invalid_type("include", "an array of strings", include)
    return semconv.RESPONSES_INCLUDE_LOGPROBS in include


def parse_responses_request(body: Any) -> ResponsesRequest:
    """Validate a ``/v1/responses`` body; raises :class:`~.errors.ApiError`."""
    body = require_object(body)
    model = model_name(body)
    if body.get("input") is None:
        raise missing("input")
    messages = input_messages(qualify_input(body["input"]))
    logprobs = _include_logprobs(body)
    top = checked(body, "top_logprobs", int, 0, minimum=0, maximum=MAX_TOP_LOGPROBS_CHAT)
    offered = responses_tools(body.get("tools"))
    tools = offered.functions
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise invalid_type("metadata", "an object", metadata)
    options = SamplingOptions(
        n=1,
        max_tokens=checked(body, "max_output_tokens", int, minimum=1),
        temperature=checked(body, "temperature", float, 1.0, minimum=0.0, maximum=2.0),
        top_p=checked(body, "top_p", float, 1.0, minimum=0.0, maximum=1.0),
        top_k=-1,
        seed=None,
        stop=(),
        logprobs=logprobs,
        top_logprobs=top if logprobs else 0,
        stream=bool(checked(body, "stream", bool, False)),
        include_usage=False,
    )
    return ResponsesRequest(
        model=model,
        instructions=checked(body, "instructions", str),
        messages=messages,
        options=options,
        tools=tools,
        tool_choice=tool_choice(body, tools, named=chosen_name),
        previous_response_id=checked(body, "previous_response_id", str),
        store=bool(checked(body, "store", bool, True)),
        metadata=metadata,
        names=offered,
    )


def new_item_id(prefix: str) -> str:
    """An id in OpenAI's Responses style (``resp_...``, ``msg_...``, ``fc_...``)."""
    return f"{prefix}_{uuid.uuid4().hex}"


def _output(
    choice: Choice, status: str, logprobs: bool, names: ResponsesTools = NO_TOOLS
) -> list[dict[str, Any]]:
    """Output items: the text as a message (when there is text, or no call), then the calls.
    ``output_text.logprobs`` are per sampled token when the output is text only (empty otherwise:
    ``output_token_logprobs`` is always aligned with ``output_token_ids``)."""
    items: list[dict[str, Any]] = []
    if choice.text or not choice.tool_calls:
        part: dict[str, Any] = {"type": "output_text", "text": choice.text, "annotations": []}
        if logprobs:
            part["logprobs"] = [] if choice.tool_calls else token_logprobs(choice)
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
                **names.call_fields(call.name),
                "arguments": call.arguments,
                "status": "completed",
            }
        )
    return items


def _echo_tool_choice(choice: ToolChoice) -> Any:
    return {"type": "function", "name": choice.name} if choice.mode == "function" else choice.mode


def response_body(
    rid: str,
    req: ResponsesRequest,
    choice: Choice,
    *,
    token_ids: bool = True,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The Response object (checked against ``openai.types.responses.Response``), with the
    token-id extension when ``token_ids`` and the ``extra`` fields."""
    from openai.types.responses import Response  # only the Responses API needs the openai package

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
        "output": _output(choice, status, req.options.logprobs, req.names),
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
    if token_ids:
        body[semconv.RESPONSES_PROMPT_TOKEN_IDS] = choice.prompt_token_ids
        body[semconv.RESPONSES_OUTPUT_TOKEN_IDS] = choice.token_ids
        if req.options.logprobs and choice.logprobs is not None:
            body[semconv.RESPONSES_OUTPUT_LOGPROBS] = choice.logprobs
    body.update(extra or {})
    return body
