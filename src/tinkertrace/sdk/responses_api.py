"""The OpenAI Responses API (``POST /v1/responses``) in the SDK's terms.

A Responses request's ``instructions`` and ``input`` items become chat messages (what a chat template
renders and what ``gen_ai.input.messages`` records); a Response object (non-streaming, or the
``response`` of the final ``response.completed`` / ``response.incomplete`` stream event) becomes a
:class:`~tinkertrace.sdk.response_parse.ResponseRecord` with one choice. Token ids and logprobs come
from the top-level extension fields (``prompt_token_ids``, ``output_token_ids``,
``output_token_logprobs``, see :mod:`tinkertrace.semconv`); a stream the agent left before its end
keeps the text and logprobs of the deltas it had.
"""

from __future__ import annotations

from typing import Any

import orjson

from tinkertrace import semconv
from tinkertrace.sdk.response_parse import ChoiceRecord, ResponseRecord, payload_version_runs

FINAL_EVENTS = ("response.completed", "response.incomplete", "response.failed")


TEXT_PART_TYPES = ("input_text", "output_text", "text")
INPUT_ROLES = ("user", "system", "developer", "assistant")


class InputError(ValueError):
    """What strict reading refuses in a Responses ``input``: ``kind`` is ``"type"`` (``detail`` says what
    was expected, ``value`` is what came), ``"value"`` (``detail`` says why; ``code`` is OpenAI's) or
    ``"missing"``; ``param`` is the path, e.g. ``input[2].content``."""

    def __init__(
        self, kind: str, param: str, detail: str = "", value: Any = None, code: str = "invalid_value"
    ) -> None:
        super().__init__(f"{param}: {detail or kind}")
        self.kind, self.param, self.detail, self.value, self.code = kind, param, detail, value, code


def _part_text(part: Any, param: str, strict: bool) -> str:
    if isinstance(part, dict):
        kind = part.get("type")
        if kind in TEXT_PART_TYPES and isinstance(part.get("text"), str):
            return part["text"]
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            return part["refusal"]
        if strict:
            detail = f"content part type {kind!r} is not supported by this server; only text parts are."
            raise InputError("value", f"{param}.type", detail, code="unsupported")
    elif strict:
        raise InputError("type", param, "an object", part)
    return ""


def text_of(content: Any, param: str = "content", *, strict: bool = False) -> str:
    """The text of a content value: a string or a list of ``input_text``/``output_text`` parts (other
    parts: refused when ``strict``, else read as empty)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_part_text(part, f"{param}[{i}]", strict) for i, part in enumerate(content))
    if strict:
        raise InputError("type", param, "a string or an array of content parts", content)
    return ""


def _function_call(item: dict[str, Any]) -> dict[str, Any]:
    """A ``function_call`` item as a chat ``tool_calls`` entry."""
    return {
        "id": item.get("call_id") or item.get("id"),
        "type": "function",
        "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
    }


def _require_strings(item: dict[str, Any], keys: tuple[str, ...], param: str) -> None:
    for key in keys:
        value = item.get(key)
        if value is None:
            raise InputError("missing", f"{param}.{key}")
        if not isinstance(value, str):
            raise InputError("type", f"{param}.{key}", "a string", value)


def input_items(value: Any, *, strict: bool = False) -> list[dict[str, Any]]:
    """A Responses ``input`` as chat messages: a string is one user message; items are messages,
    function calls (joined onto the assistant message before them, as a chat template renders a reply
    with calls) and function call outputs (``tool`` messages); reasoning items are skipped.

    ``strict`` (the endpoint): anything else, or a malformed item, raises :class:`InputError`, and an
    input with no message is refused. Lenient (the SDK, recording what an agent sent): what cannot be
    read is left out."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if strict and not isinstance(value, list):
        raise InputError("type", "input", "a string or an array of input items", value)
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(value if isinstance(value, list) else []):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            if strict:
                raise InputError("type", param, "an object", item)
            continue
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role", None if strict else "user")
            if strict and role not in INPUT_ROLES:
                raise InputError("value", f"{param}.role", f"{role!r} is not one of {list(INPUT_ROLES)}.")
            messages.append(
                {"role": role, "content": text_of(item.get("content"), f"{param}.content", strict=strict)}
            )
        elif kind == "function_call":
            if strict:
                _require_strings(item, ("call_id", "name", "arguments"), param)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(_function_call(item))
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [_function_call(item)]})
        elif kind == "function_call_output":
            if strict:
                _require_strings(item, ("call_id",), param)
            output = text_of(item.get("output"), f"{param}.output", strict=strict)
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
        elif strict and kind != "reasoning":
            detail = (
                f"input item type {kind!r} is not supported by this server; use message, function_call "
                "or function_call_output items."
            )
            raise InputError("value", f"{param}.type", detail, code="unsupported")
    if strict and not messages:
        raise InputError("value", "input", "expected at least one message or function call output.")
    return messages


def input_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Chat messages of a Responses request, read leniently: ``instructions`` as the system message,
    then ``input`` (:func:`input_items`)."""
    instructions = body.get("instructions")
    system = [{"role": "system", "content": instructions}] if isinstance(instructions, str) else []
    return system + input_items(body.get("input"))


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Responses ``function`` tools (flat) in the chat form a chat template expects; others dropped."""
    if not isinstance(tools, list):
        return None
    out = []
    for tool in tools:
        if isinstance(tool, dict) and tool.get("type") == "function" and tool.get("name"):
            fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
            out.append({"type": "function", "function": fn})
    return out or None


def finish_reason(response: dict[str, Any], has_tool_calls: bool) -> str:
    """A chat-style finish reason: ``length`` for ``max_output_tokens``, ``tool_calls``, ``stop``."""
    status = response.get("status")
    if status == "incomplete":
        reason = (response.get("incomplete_details") or {}).get("reason")
        return "length" if reason == "max_output_tokens" else str(reason or "incomplete")
    if status == "failed":
        return "error"
    return "tool_calls" if has_tool_calls else "stop"


def apply_token_extension(record: ResponseRecord, choice: ChoiceRecord, payload: dict[str, Any]) -> None:
    """The token-id extension (prompt ids, output ids, output logprobs) and the policy version of a
    Response, or of an Anthropic Message or its stream event, folded into ``record``'s ``choice``."""
    if payload.get(semconv.RESPONSES_PROMPT_TOKEN_IDS) is not None:
        record.prompt_token_ids = list(payload[semconv.RESPONSES_PROMPT_TOKEN_IDS])
    if payload.get(semconv.RESPONSES_OUTPUT_TOKEN_IDS) is not None:
        choice.token_ids = list(payload[semconv.RESPONSES_OUTPUT_TOKEN_IDS])
    if payload.get(semconv.RESPONSES_OUTPUT_LOGPROBS) is not None:
        choice.logprobs = [float(lp) for lp in payload[semconv.RESPONSES_OUTPUT_LOGPROBS]]
    if payload.get(semconv.RESPONSE_POLICY_VERSION) is not None:
        record.policy_version = int(payload[semconv.RESPONSE_POLICY_VERSION])
    choice.policy_version_runs = payload_version_runs(payload) or choice.policy_version_runs


def apply_response(record: ResponseRecord, response: dict[str, Any]) -> None:
    """Fold a Response object into ``record`` (choice 0 holds the whole output)."""
    record.response_id = response.get("id") or record.response_id
    record.model = response.get("model") or record.model
    choice = record.choices[0] = ChoiceRecord(0)
    text_logprobs: list[float] = []
    for item in response.get("output") or []:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            for part in item.get("content") or []:
                if isinstance(part, dict) and part.get("type") == "output_text":
                    choice.text.append(str(part.get("text", "")))
                    text_logprobs += [float(lp["logprob"]) for lp in part.get("logprobs") or []]
        elif item.get("type") == "function_call":
            choice.tool_calls[len(choice.tool_calls)] = _function_call(item)
    choice.finish_reason = finish_reason(response, bool(choice.tool_calls))
    apply_token_extension(record, choice, response)
    if choice.logprobs is None and text_logprobs:
        choice.logprobs = text_logprobs  # aligned with the ids only when the output is all text
    usage = response.get("usage")
    if isinstance(usage, dict):
        record.usage = {
            "prompt_tokens": usage.get("input_tokens"),
            "completion_tokens": usage.get("output_tokens"),
        }


def parse_json(body: bytes) -> ResponseRecord:
    record = ResponseRecord()
    apply_response(record, orjson.loads(body))
    return record


def parse_sse(body: bytes) -> ResponseRecord:
    """A Responses event stream: the final event's Response (the stream's last event, the only one
    parsed then); without one (the agent stopped reading), what the deltas carried (text, logprobs,
    finished function calls)."""
    record = ResponseRecord()
    events = [line[5:] for line in body.splitlines() if line.startswith(b"data:")]
    last = orjson.loads(events[-1]) if events else {}
    if last.get("type") in FINAL_EVENTS:
        apply_response(record, last["response"])
        return record
    choice = record.choice(0)
    for data in events:
        event = orjson.loads(data)
        kind = event.get("type")
        if kind == "response.created":
            record.response_id = event["response"].get("id")
            record.model = event["response"].get("model")
        elif kind == "response.output_text.delta":
            choice.text.append(str(event.get("delta", "")))
            if event.get("logprobs"):
                choice.logprobs = choice.logprobs or []
                choice.logprobs.extend(float(lp["logprob"]) for lp in event["logprobs"])
        elif kind == "response.output_item.done" and event.get("item", {}).get("type") == "function_call":
            choice.tool_calls[len(choice.tool_calls)] = _function_call(event["item"])
    return record
