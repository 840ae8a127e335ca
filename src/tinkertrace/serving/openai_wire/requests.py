"""``/v1/chat/completions`` and ``/v1/completions`` request bodies, validated as OpenAI does.

Parsing raises :class:`~tinkertrace.serving.openai_wire.errors.ApiError` (a 400 in OpenAI's shape);
unknown fields (``return_token_ids``, vLLM's sampling extras) are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tinkertrace.serving.openai_wire.errors import (
    ApiError,
    checked,
    invalid_type,
    invalid_value,
    missing,
    objects_in,
    require_object,
)
from tinkertrace.serving.openai_wire.tools import ToolChoice, function_tools, tool_choice

MAX_N = 128
MAX_TOP_LOGPROBS_CHAT = 20
MAX_LOGPROBS_COMPLETION = 5
MAX_STOP_SEQUENCES = 16
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


@dataclass(frozen=True)
class SamplingOptions:
    """The sampling part of a request, common to chat, completions and the Responses API."""

    n: int
    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: tuple[str, ...]
    logprobs: bool
    top_logprobs: int
    stream: bool
    include_usage: bool


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[dict[str, Any]]  # content normalised to text
    options: SamplingOptions
    tools: list[dict[str, Any]] | None
    tool_choice: ToolChoice


@dataclass(frozen=True)
class CompletionRequest:
    model: str
    prompts: list[str | list[int]]
    options: SamplingOptions


def model_name(body: dict[str, Any]) -> str:
    if body.get("model") is None:
        raise missing("model")
    return str(checked(body, "model", str))


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise invalid_type("stop", "a string or an array of strings", stop)
    if len(stop) > MAX_STOP_SEQUENCES:
        raise invalid_value("stop", f"at most {MAX_STOP_SEQUENCES} stop sequences are supported.")
    if any(s == "" for s in stop):
        raise invalid_value("stop", "stop sequences must not be empty.")
    return tuple(stop)


def _common_options(body: dict[str, Any], *, logprobs: bool, top_logprobs: int) -> SamplingOptions:
    max_tokens = checked(body, "max_completion_tokens", int, minimum=1)
    if max_tokens is None:
        max_tokens = checked(body, "max_tokens", int, minimum=1)
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise invalid_type("stream_options", "an object", stream_options)
    stream = bool(checked(body, "stream", bool, False))
    if stream_options is not None and not stream:
        raise invalid_value("stream_options", "stream_options is only allowed when 'stream' is true.")
    include_usage = bool(checked(stream_options or {}, "include_usage", bool, False))
    for unsupported in ("echo", "suffix"):
        if body.get(unsupported):
            raise ApiError(
                400,
                f"'{unsupported}' is not supported by this server.",
                param=unsupported,
                code="unsupported",
            )
    return SamplingOptions(
        n=checked(body, "n", int, 1, minimum=1, maximum=MAX_N),
        max_tokens=max_tokens,
        temperature=checked(body, "temperature", float, 1.0, minimum=0.0, maximum=2.0),
        top_p=checked(body, "top_p", float, 1.0, minimum=0.0, maximum=1.0),
        top_k=checked(body, "top_k", int, -1, minimum=-1),
        seed=checked(body, "seed", int),
        stop=_stop(body),
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        stream=stream,
        include_usage=include_usage,
    )


def _content_text(content: Any, param: str) -> str:
    """A message's text: a string, or a list of ``{"type": "text", "text": ...}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict):
                raise invalid_type(f"{param}[{i}]", "an object", part)
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise invalid_value(f"{param}[{i}]", "only text content parts are supported.")
            texts.append(part["text"])
        return "".join(texts)
    raise invalid_type(param, "a string or an array of content parts", content)


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if messages is None:
        raise missing("messages")
    if isinstance(messages, list) and not messages:
        raise ApiError(
            400,
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty "
            "array instead.",
            param="messages",
            code="empty_array",
        )
    out = []
    for param, message in objects_in(messages, "messages", "an array"):
        role = message.get("role")
        if role is None:
            raise missing(f"{param}.role")
        if role not in CHAT_ROLES:
            raise invalid_value(
                f"{param}.role", f"'{role}' is not one of {sorted(CHAT_ROLES)} (in '{param}.role')."
            )
        normalised = {k: v for k, v in message.items() if k != "content"}
        normalised["content"] = _content_text(message.get("content"), f"{param}.content")
        out.append(normalised)
    return out


def parse_chat_request(body: Any) -> ChatRequest:
    """Validate a ``/v1/chat/completions`` body; raises :class:`ApiError`."""
    body = require_object(body)
    model = model_name(body)
    messages = _messages(body)
    want_logprobs = bool(checked(body, "logprobs", bool, False))
    top = checked(body, "top_logprobs", int, 0, minimum=0, maximum=MAX_TOP_LOGPROBS_CHAT)
    if top and not want_logprobs:
        raise invalid_value("top_logprobs", "'logprobs' must be true when 'top_logprobs' is set.")
    tools = function_tools(body.get("tools"), nested=True)
    options = _common_options(body, logprobs=want_logprobs, top_logprobs=top)
    choice = tool_choice(body, tools, named=lambda c: (c.get("function") or {}).get("name"))
    return ChatRequest(model=model, messages=messages, options=options, tools=tools, tool_choice=choice)


def _prompts(body: dict[str, Any]) -> list[str | list[int]]:
    prompt = body.get("prompt")
    if prompt is None:
        raise missing("prompt")
    if isinstance(prompt, str):
        return [prompt]
    expected = "a string, an array of strings, an array of token ids or an array of such arrays"
    if not isinstance(prompt, list) or not prompt:
        raise invalid_type("prompt", expected, prompt)

    def is_ids(x: Any) -> bool:
        return isinstance(x, list) and bool(x) and all(type(t) is int and t >= 0 for t in x)

    if is_ids(prompt):
        return [prompt]
    if all(isinstance(p, str) for p in prompt) or all(is_ids(p) for p in prompt):
        return list(prompt)
    raise invalid_type("prompt", expected, prompt)


def parse_completion_request(body: Any) -> CompletionRequest:
    """Validate a ``/v1/completions`` body; raises :class:`ApiError`."""
    body = require_object(body)
    model = model_name(body)
    prompts = _prompts(body)
    logprobs = checked(body, "logprobs", int, None, minimum=0, maximum=MAX_LOGPROBS_COMPLETION)
    options = _common_options(body, logprobs=logprobs is not None, top_logprobs=logprobs or 0)
    if len(prompts) * options.n > MAX_N:
        raise invalid_value("n", f"prompts x n must be at most {MAX_N}.")
    return CompletionRequest(model=model, prompts=prompts, options=options)
