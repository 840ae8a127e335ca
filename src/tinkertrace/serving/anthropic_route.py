"""``POST /v1/messages``: Anthropic's Messages API served over the chat path, within the context window.

The request becomes a chat request (:mod:`tinkertrace.serving.anthropic_wire`); its prompt is the chat
template's rendering, with ``system`` messages in place or, where the template refuses a system turn
there, folded into the leading system prompt (:func:`render`). The prompt must fit the served model's
context (:mod:`tinkertrace.serving.context_window`): a ``max_tokens`` above the room it leaves is
clamped to that room (harnesses ask for 32,000 whatever the model), and a prompt that leaves no room
is Anthropic's own error, 400 ``invalid_request_error`` ``prompt is too long: N tokens > M maximum``
(:func:`~tinkertrace.serving.anthropic_wire.prompt_too_long`), which Claude Code reads to compact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tinkertrace import semconv
from tinkertrace.serving import anthropic_wire
from tinkertrace.serving.context_window import PromptTooLong
from tinkertrace.serving.generation import Generator
from tinkertrace.serving.openai_wire import completions as wire
from tinkertrace.serving.openai_wire.errors import ApiError, read_json, require_object
from tinkertrace.serving.openai_wire.requests import parse_chat_request
from tinkertrace.serving.openai_wire.sse import sse_response
from tinkertrace.serving.tool_use import plan_tools

if TYPE_CHECKING:
    from tinkertrace.serving.policy import PolicyHolder
    from tinkertrace.serving.tool_parsers import ToolParser


class SamplingEndpoint(Protocol):
    """What these handlers use of :class:`tinkertrace.serving.app.SamplingEndpoint` (a protocol, so
    that the app imports this module and not the other way round)."""

    policy: PolicyHolder
    generator: Generator
    tool_parser: ToolParser | None
    requests_served: int

    def _check_model(self, model: str) -> None: ...

    async def _admit(self, request: Request) -> None: ...


def render(
    generator: Generator, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, prefix: str
) -> list[int]:
    """The prompt's token ids: system messages at their place, else (the template refused that)
    folded into the leading system prompt."""
    try:
        return generator.chat_prompt(messages, tools, prefix)
    except ApiError:
        if not any(m.get("role") == "system" for m in messages[1:]):
            raise
    return generator.chat_prompt(anthropic_wire.merged_system(messages), tools, prefix)


async def serve_messages(endpoint: SamplingEndpoint, request: Request) -> Response:
    """Answer one Messages request with a Message object or its event stream."""
    req = parse_chat_request(anthropic_wire.chat_body(await read_json(request)))
    endpoint._check_model(req.model)
    await endpoint._admit(request)
    policy = endpoint.policy.current()  # this request samples with this snapshot to the end
    plan = plan_tools(endpoint.tool_parser, req.tools, req.tool_choice)
    generator = endpoint.generator
    prompt_ids = render(generator, req.messages, req.tools, plan.prefix)
    try:  # max_tokens is clamped to the room the prompt leaves (Generator.generate)
        [sampled] = await generator.generate(policy, prompt_ids, plan.options(req.options))
    except PromptTooLong as exc:
        raise anthropic_wire.prompt_too_long(exc.prompt_tokens, exc.limit) from None
    endpoint.requests_served += 1
    choice = plan.apply(sampled)
    rid = anthropic_wire.message_id(wire.new_id("chatcmpl"))
    body = anthropic_wire.message_body(rid, req.model, choice, policy.version)
    headers = {semconv.HEADER_POLICY_VERSION: str(policy.version)}
    if req.options.stream:
        return sse_response(anthropic_wire.stream_events(body), headers, named=True)
    return JSONResponse(body, headers=headers)


async def count_tokens(endpoint: SamplingEndpoint, request: Request) -> Response:
    """``POST /v1/messages/count_tokens``: ``{"input_tokens": N}``, the length of the prompt the same
    Messages request would be given (tools included); errors in Anthropic's shape."""
    try:
        body = require_object(await read_json(request))
        req = parse_chat_request(anthropic_wire.chat_body({**body, "max_tokens": 1, "stream": False}))
        endpoint._check_model(req.model)
        plan = plan_tools(endpoint.tool_parser, req.tools, req.tool_choice)
        prompt_ids = render(endpoint.generator, req.messages, req.tools, plan.prefix)
    except ApiError as err:
        return JSONResponse(err.anthropic_body(), status_code=err.status)
    return JSONResponse({"input_tokens": len(prompt_ids)})
