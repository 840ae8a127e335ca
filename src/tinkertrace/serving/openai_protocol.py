"""OpenAI wire format: request validation and response/chunk building for the sampling endpoint.

Validation answers the way OpenAI does: an :class:`ApiError` carries the HTTP status and the
``{"error": {"message", "type", "param", "code"}}`` body. Responses always carry the vLLM-style
``prompt_token_ids`` and ``choices[].token_ids`` and the ``policy_version`` that produced them.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tinkertrace import semconv
from tinkertrace.serving.tool_parsers import ToolCall

MAX_N = 128
MAX_TOP_LOGPROBS_CHAT = 20
MAX_LOGPROBS_COMPLETION = 5
MAX_STOP_SEQUENCES = 16
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


class ApiError(Exception):
    """An error answered to the client in OpenAI's format."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# --- validation -------------------------------------------------------------------------------------
_TYPE_NAMES = {int: "an integer", float: "a number", bool: "a boolean", str: "a string", list: "an array"}
_JSON_NAMES = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "an array",
    dict: "an object",
    type(None): "null",
}


def _json_kind(value: Any) -> str:
    return _JSON_NAMES.get(type(value), type(value).__name__)


def _invalid_type(param: str, expected: str, value: Any) -> ApiError:
    return ApiError(
        400,
        f"Invalid type for '{param}': expected {expected}, but got {_json_kind(value)} instead.",
        param=param,
        code="invalid_type",
    )


def _invalid_value(param: str, message: str) -> ApiError:
    return ApiError(400, f"Invalid value for '{param}': {message}", param=param, code="invalid_value")


def _missing(param: str) -> ApiError:
    return ApiError(
        400, f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def _field(
    body: dict[str, Any],
    name: str,
    kind: type,
    default: Any = None,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
) -> Any:
    """``body[name]`` checked to be of JSON ``kind`` (and in range); ``default`` when absent or null."""
    value = body.get(name)
    if value is None:
        return default
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok, value = True, float(value)
    if not ok:
        raise _invalid_type(name, _TYPE_NAMES[kind], value)
    if minimum is not None and value < minimum:
        raise _invalid_value(name, f"expected a value >= {minimum}, but got {value} instead.")
    if maximum is not None and value > maximum:
        raise _invalid_value(name, f"expected a value <= {maximum}, but got {value} instead.")
    return value


@dataclass(frozen=True)
class SamplingOptions:
    """The sampling part of a request, common to chat and completions."""

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
class ToolChoice:
    """``tool_choice`` and ``parallel_tool_calls``: ``mode`` is auto, none, required or function
    (then ``name`` is the function that must be called)."""

    mode: str = "none"
    name: str | None = None
    parallel: bool = True


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[dict[str, Any]]
    options: SamplingOptions
    tools: list[dict[str, Any]] | None
    tool_choice: ToolChoice = ToolChoice()


@dataclass(frozen=True)
class CompletionRequest:
    model: str
    prompts: list[str | list[int]]
    options: SamplingOptions


def _require_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, f"The request body must be a JSON object, but got {_json_kind(body)}.")
    return body


def _model(body: dict[str, Any]) -> str:
    if body.get("model") is None:
        raise _missing("model")
    return str(_field(body, "model", str))


def _stop(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise _invalid_type("stop", "a string or an array of strings", stop)
    if len(stop) > MAX_STOP_SEQUENCES:
        raise _invalid_value("stop", f"at most {MAX_STOP_SEQUENCES} stop sequences are supported.")
    if any(s == "" for s in stop):
        raise _invalid_value("stop", "stop sequences must not be empty.")
    return tuple(stop)


def _common_options(body: dict[str, Any], *, logprobs: bool, top_logprobs: int) -> SamplingOptions:
    max_tokens = _field(body, "max_completion_tokens", int, minimum=1)
    if max_tokens is None:
        max_tokens = _field(body, "max_tokens", int, minimum=1)
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise _invalid_type("stream_options", "an object", stream_options)
    stream = bool(_field(body, "stream", bool, False))
    if stream_options is not None and not stream:
        raise _invalid_value("stream_options", "stream_options is only allowed when 'stream' is true.")
    include_usage = bool(_field(stream_options or {}, "include_usage", bool, False))
    for unsupported in ("echo", "suffix"):
        if body.get(unsupported):
            raise ApiError(
                400,
                f"'{unsupported}' is not supported by this server.",
                param=unsupported,
                code="unsupported",
            )
    return SamplingOptions(
        n=_field(body, "n", int, 1, minimum=1, maximum=MAX_N),
        max_tokens=max_tokens,
        temperature=_field(body, "temperature", float, 1.0, minimum=0.0, maximum=2.0),
        top_p=_field(body, "top_p", float, 1.0, minimum=0.0, maximum=1.0),
        top_k=_field(body, "top_k", int, -1, minimum=-1),
        seed=_field(body, "seed", int),
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
                raise _invalid_type(f"{param}[{i}]", "an object", part)
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _invalid_value(f"{param}[{i}]", "only text content parts are supported.")
            texts.append(part["text"])
        return "".join(texts)
    raise _invalid_type(param, "a string or an array of content parts", content)


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if messages is None:
        raise _missing("messages")
    if not isinstance(messages, list):
        raise _invalid_type("messages", "an array", messages)
    if not messages:
        raise ApiError(
            400,
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty "
            "array instead.",
            param="messages",
            code="empty_array",
        )
    out = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _invalid_type(param, "an object", message)
        role = message.get("role")
        if role is None:
            raise _missing(f"{param}.role")
        if role not in CHAT_ROLES:
            raise _invalid_value(
                f"{param}.role", f"'{role}' is not one of {sorted(CHAT_ROLES)} (in '{param}.role')."
            )
        normalised = {k: v for k, v in message.items() if k != "content"}
        normalised["content"] = _content_text(message.get("content"), f"{param}.content")
        out.append(normalised)
    return out


def parse_chat_request(body: Any) -> ChatRequest:
    """Validate a ``/v1/chat/completions`` body; raises :class:`ApiError`."""
    body = _require_object(body)
    model = _model(body)
    messages = _messages(body)
    want_logprobs = bool(_field(body, "logprobs", bool, False))
    top = _field(body, "top_logprobs", int, 0, minimum=0, maximum=MAX_TOP_LOGPROBS_CHAT)
    if top and not want_logprobs:
        raise _invalid_value("top_logprobs", "'logprobs' must be true when 'top_logprobs' is set.")
    tools = function_tools(body.get("tools"), nested=True)
    options = _common_options(body, logprobs=want_logprobs, top_logprobs=top)
    choice = tool_choice(body, tools, named=lambda c: (c.get("function") or {}).get("name"))
    return ChatRequest(model=model, messages=messages, options=options, tools=tools, tool_choice=choice)


# --- tools ------------------------------------------------------------------------------------------
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def _function_tool(fn: Any, param: str) -> dict[str, Any]:
    """A validated ``{"name", "description"?, "parameters"?}`` function definition."""
    if not isinstance(fn, dict):
        raise _invalid_type(param, "an object", fn)
    name = fn.get("name")
    if name is None:
        raise _missing(f"{param}.name")
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise _invalid_value(
            f"{param}.name",
            f"{name!r} does not match '^[a-zA-Z0-9_-]{{1,64}}$' (letters, digits, _ and -, at most 64).",
        )
    out: dict[str, Any] = {"name": name}
    if fn.get("description") is not None:
        out["description"] = _field(fn, "description", str)
    if fn.get("parameters") is not None:
        if not isinstance(fn["parameters"], dict):
            raise _invalid_type(f"{param}.parameters", "an object (a JSON schema)", fn["parameters"])
        out["parameters"] = fn["parameters"]
    return out


def function_tools(tools: Any, *, nested: bool) -> list[dict[str, Any]] | None:
    """Validated function ``tools`` in chat form, ``[{"type": "function", "function": {...}}]`` (None
    when absent or empty). ``nested``: chat's form; else the Responses API's flat ``{"type":
    "function", "name", ...}``. Other tool types are refused (the server cannot run them)."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise _invalid_type("tools", "an array", tools)
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _invalid_type(param, "an object", tool)
        if tool.get("type") != "function":
            raise ApiError(
                400,
                f"Invalid value for '{param}.type': tool type {tool.get('type')!r} is not supported by "
                "this server; only 'function' tools are.",
                param=f"{param}.type",
                code="unsupported_tool_type",
            )
        if nested and tool.get("function") is None:
            raise _missing(f"{param}.function")
        fn = _function_tool(tool["function"], f"{param}.function") if nested else _function_tool(tool, param)
        if any(t["function"]["name"] == fn["name"] for t in out):
            raise _invalid_value(param, f"duplicate function name {fn['name']!r}.")
        out.append({"type": "function", "function": fn})
    return out or None


def tool_choice(
    body: dict[str, Any], tools: list[dict[str, Any]] | None, *, named: Callable[[dict[str, Any]], Any]
) -> ToolChoice:
    """``tool_choice`` and ``parallel_tool_calls`` checked against ``tools``; ``named`` reads the
    function name of an object choice (chat nests it in ``function``, Responses does not)."""
    parallel = bool(_field(body, "parallel_tool_calls", bool, True))
    choice = body.get("tool_choice")
    if choice is None:
        return ToolChoice("auto" if tools else "none", None, parallel)
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise _invalid_value("tool_choice", f"{choice!r} is not one of 'auto', 'none', 'required'.")
        if choice != "none" and not tools:
            raise _invalid_value("tool_choice", f"{choice!r} needs 'tools' to be specified.")
        return ToolChoice(choice, None, parallel)
    if not isinstance(choice, dict):
        raise _invalid_type("tool_choice", "a string or an object", choice)
    if choice.get("type") != "function":
        raise ApiError(
            400,
            f"Invalid value for 'tool_choice.type': {choice.get('type')!r} is not supported by this "
            "server; use 'auto', 'none', 'required' or {'type': 'function', ...}.",
            param="tool_choice.type",
            code="unsupported",
        )
    name = named(choice)
    known = [t["function"]["name"] for t in tools or []]
    if name not in known:
        raise _invalid_value(
            "tool_choice",
            f"the function {name!r} is not among the tools given ({', '.join(known) or 'none'}).",
        )
    return ToolChoice("function", name, parallel)


def _prompts(body: dict[str, Any]) -> list[str | list[int]]:
    prompt = body.get("prompt")
    if prompt is None:
        raise _missing("prompt")
    if isinstance(prompt, str):
        return [prompt]
    expected = "a string, an array of strings, an array of token ids or an array of such arrays"
    if not isinstance(prompt, list) or not prompt:
        raise _invalid_type("prompt", expected, prompt)

    def is_ids(x: Any) -> bool:
        return isinstance(x, list) and bool(x) and all(type(t) is int and t >= 0 for t in x)

    if is_ids(prompt):
        return [prompt]
    if all(isinstance(p, str) for p in prompt) or all(is_ids(p) for p in prompt):
        return list(prompt)
    raise _invalid_type("prompt", expected, prompt)


def parse_completion_request(body: Any) -> CompletionRequest:
    """Validate a ``/v1/completions`` body; raises :class:`ApiError`."""
    body = _require_object(body)
    model = _model(body)
    prompts = _prompts(body)
    logprobs = _field(body, "logprobs", int, None, minimum=0, maximum=MAX_LOGPROBS_COMPLETION)
    options = _common_options(body, logprobs=logprobs is not None, top_logprobs=logprobs or 0)
    if len(prompts) * options.n > MAX_N:
        raise _invalid_value("n", f"prompts x n must be at most {MAX_N}.")
    return CompletionRequest(model=model, prompts=prompts, options=options)


# --- responses -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Choice:
    """One sampled sequence, decoded: what a response's choice is built from."""

    text: str
    token_ids: list[int]
    logprobs: list[float] | None
    token_texts: list[str] | None  # display string of each sampled token (when logprobs were asked)
    top_logprobs: list[list[tuple[str, float]]] | None  # per token: (token text, logprob), best first
    finish_reason: str
    prompt_token_ids: list[int]
    tool_calls: tuple[ToolCall, ...] = ()  # parsed from the text, which then holds only the content


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _chat_logprobs(choice: Choice) -> dict[str, Any] | None:
    if choice.logprobs is None or choice.token_texts is None:
        return None
    tops = choice.top_logprobs or [[] for _ in choice.logprobs]
    content = [
        {
            "token": text,
            "logprob": lp,
            "bytes": list(text.encode()),
            "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in top],
        }
        for text, lp, top in zip(choice.token_texts, choice.logprobs, tops, strict=True)
    ]
    return {"content": content, "refusal": None}


def _completion_logprobs(choice: Choice, top_n: int) -> dict[str, Any] | None:
    if choice.logprobs is None or choice.token_texts is None:
        return None
    offsets, pos = [], 0
    for text in choice.token_texts:
        offsets.append(pos)
        pos += len(text)
    tops = None
    if top_n and choice.top_logprobs is not None:
        tops = [dict(top[:top_n]) for top in choice.top_logprobs]
    return {
        "tokens": choice.token_texts,
        "token_logprobs": choice.logprobs,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def _envelope(kind: str, rid: str, model: str, version: int) -> dict[str, Any]:
    return {
        "id": rid,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": f"policy-v{version}",
        semconv.RESPONSE_POLICY_VERSION: version,
    }


def _chat_message(c: Choice) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": c.text if c.text or not c.tool_calls else None,
        "refusal": None,
    }
    if c.tool_calls:
        message["tool_calls"] = [call.as_openai() for call in c.tool_calls]
    return message


def _tool_call_deltas(c: Choice) -> list[dict[str, Any]]:
    """Per call, like vLLM: a delta with id, type and name, then one with the arguments."""
    deltas = []
    for k, call in enumerate(c.tool_calls):
        head = {
            "index": k,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        deltas.append({"tool_calls": [head]})
        deltas.append({"tool_calls": [{"index": k, "function": {"arguments": call.arguments}}]})
    return deltas


def chat_response(rid: str, model: str, version: int, choices: list[Choice]) -> dict[str, Any]:
    """A complete ``chat.completion`` object."""
    prompt_ids = choices[0].prompt_token_ids
    return {
        **_envelope("chat.completion", rid, model, version),
        "choices": [
            {
                "index": i,
                "message": _chat_message(c),
                "logprobs": _chat_logprobs(c),
                "finish_reason": c.finish_reason,
                semconv.RESPONSE_CHOICE_TOKEN_IDS: c.token_ids,
            }
            for i, c in enumerate(choices)
        ],
        "usage": usage(len(prompt_ids), sum(len(c.token_ids) for c in choices)),
        semconv.RESPONSE_PROMPT_TOKEN_IDS: prompt_ids,
    }


def chat_chunks(
    rid: str, model: str, version: int, choices: list[Choice], include_usage: bool
) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a streamed chat answer (without ``[DONE]``).

    Per choice: a role chunk, one content chunk carrying the choice's text, then two chunks per tool
    call (id and name, then arguments), and a finish chunk. The first chunk after the role carries
    the choice's ``token_ids`` and logprobs (the backend returns whole samples, so there is nothing
    to gain from smaller pieces). The first chunk carries ``prompt_token_ids``; with ``include_usage`` every
    chunk has ``usage: null`` and a last chunk with no choices carries the usage.
    """
    base = _envelope("chat.completion.chunk", rid, model, version)
    if include_usage:
        base["usage"] = None
    out: list[dict[str, Any]] = []
    for i, c in enumerate(choices):
        role = {
            "index": i,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        first = {**base, "choices": [role]}
        if i == 0:
            first[semconv.RESPONSE_PROMPT_TOKEN_IDS] = c.prompt_token_ids
        out.append(first)
        deltas = ([{"content": c.text}] if c.text or not c.tool_calls else []) + _tool_call_deltas(c)
        for k, delta in enumerate(deltas):
            piece: dict[str, Any] = {"index": i, "delta": delta, "logprobs": None, "finish_reason": None}
            if k == 0:
                piece["logprobs"] = _chat_logprobs(c)
                piece[semconv.RESPONSE_CHOICE_TOKEN_IDS] = c.token_ids
            out.append({**base, "choices": [piece]})
        finish = {"index": i, "delta": {}, "logprobs": None, "finish_reason": c.finish_reason}
        out.append({**base, "choices": [finish]})
    if include_usage:
        prompt_tokens = len(choices[0].prompt_token_ids)
        out.append(
            {**base, "choices": [], "usage": usage(prompt_tokens, sum(len(c.token_ids) for c in choices))}
        )
    return out


def _completion_usage(choices: list[Choice], n: int) -> dict[str, int]:
    prompt_tokens = sum(len(c.prompt_token_ids) for c in choices[::n])
    return usage(prompt_tokens, sum(len(c.token_ids) for c in choices))


def _completion_choice(i: int, c: Choice, top_n: int, text: str | None = None) -> dict[str, Any]:
    return {
        "index": i,
        "text": c.text if text is None else text,
        "logprobs": _completion_logprobs(c, top_n),
        "finish_reason": c.finish_reason,
        semconv.RESPONSE_PROMPT_TOKEN_IDS: c.prompt_token_ids,
        semconv.RESPONSE_CHOICE_TOKEN_IDS: c.token_ids,
    }


def completion_response(
    rid: str, model: str, version: int, choices: list[Choice], n: int, top_n: int
) -> dict[str, Any]:
    """A complete ``text_completion`` object; ``choices`` are prompt-major (prompt i, sample j at i*n+j)."""
    body = {
        **_envelope("text_completion", rid, model, version),
        "choices": [_completion_choice(i, c, top_n) for i, c in enumerate(choices)],
        "usage": _completion_usage(choices, n),
    }
    if len(choices) == n:  # one prompt: also at the top level, like chat
        body[semconv.RESPONSE_PROMPT_TOKEN_IDS] = choices[0].prompt_token_ids
    return body


def completion_chunks(
    rid: str, model: str, version: int, choices: list[Choice], n: int, top_n: int, include_usage: bool
) -> list[dict[str, Any]]:
    """The chunks of a streamed completion: one per choice (text, ids, logprobs, finish reason)."""
    base = _envelope("text_completion", rid, model, version)
    if include_usage:
        base["usage"] = None
    out = [{**base, "choices": [_completion_choice(i, c, top_n)]} for i, c in enumerate(choices)]
    if include_usage:
        out.append({**base, "choices": [], "usage": _completion_usage(choices, n)})
    return out


def models_list(model: str, version: int, created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": model,
                "object": "model",
                "created": created,
                "owned_by": "tinkertrace",
                semconv.RESPONSE_POLICY_VERSION: version,
            }
        ],
    }
