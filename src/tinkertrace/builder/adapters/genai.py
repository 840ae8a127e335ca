"""The OpenTelemetry GenAI semantic conventions: LLM spans by ``gen_ai.operation.name``, rewards as
``gen_ai.evaluation.result`` spans.

Written by the official ``opentelemetry-instrumentation-openai-v2`` (content on the span with
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=span_only``) and OpenLLMetry
(``opentelemetry-instrumentation-openai``), and read for Logfire's spans too
(:mod:`.logfire`). Messages are the *parts* form: ``gen_ai.input.messages`` /
``gen_ai.output.messages`` (JSON lists of ``{role, parts: [{type: text|tool_call|
tool_call_response, ...}]}``), ``gen_ai.system_instructions``, tools in ``gen_ai.tool.definitions``.
None of these producers records token ids: their calls are re-tokenised at build time. Agent spans
are ``invoke_agent`` operations (:data:`AGENT_NAME`).

openai-v2 in its default (non-experimental) mode with content capture on (``..._CAPTURE_MESSAGE_CONTENT
=true``) sends the older per-message log events instead: ``gen_ai.{system,user,assistant,tool}.message``
(the message in the record's body) and ``gen_ai.choice`` (body ``{index, finish_reason, message}``),
each a log record of the call's span. The builder joins them to their span, in emission order, under
the key :data:`MESSAGE_EVENTS` (:mod:`tinkertrace.builder.retokenize`); :func:`conversation` reads them
where the parts-form attributes are absent.
"""

from __future__ import annotations

import json
from typing import Any

from tinkertrace import semconv as sc
from tinkertrace.builder.adapters.base import Adapter, Conversation
from tinkertrace.spanstore.sql import attr, literal_list

LLM_OPERATIONS = ("chat", "text_completion", "generate_content", "responses")
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
TOOL_DEFINITIONS = "gen_ai.tool.definitions"
MESSAGE_EVENT_ROLES = ("system", "user", "assistant", "tool")
MESSAGE_EVENT_NAMES = (*(f"gen_ai.{role}.message" for role in MESSAGE_EVENT_ROLES), "gen_ai.choice")
MESSAGE_EVENTS = "tinkertrace.genai.message_events"
"""Key the builder gives a call's per-message events (a list of ``{name, body}``, the body JSON text)."""

IS_LLM = f"{attr(sc.GENAI_OPERATION)} IN ({literal_list(LLM_OPERATIONS)})"
IS_REWARD = f"(name = '{sc.REWARD_SPAN_NAME}' AND {attr(sc.GENAI_EVALUATION_SCORE)} IS NOT NULL)"
SCORE = f"TRY_CAST({attr(sc.GENAI_EVALUATION_SCORE)} AS DOUBLE)"
FINISH_REASONS = (attr(sc.GENAI_FINISH_REASONS), attr(sc.AGL_FINISH_REASON))
"""``gen_ai.response.finish_reasons`` written as a plain string (the list form is ours), and
OpenLLMetry's per-choice ``gen_ai.completion.0.finish_reason``."""
_INVOKED = f"{attr(sc.GENAI_OPERATION)} = '{sc.AGENT_OPERATION}'"
AGENT_NAME = (
    f"CASE WHEN {_INVOKED} THEN COALESCE(agent_name, "
    f"NULLIF(regexp_extract(name, '^{sc.AGENT_OPERATION} (.+)$', 1), '')) END"
)
"""An ``invoke_agent`` span's agent: ``gen_ai.agent.name`` (the ``agent_name`` column), else the name in
its span name ``invoke_agent {name}``."""


def _text(parts: list[Any]) -> str:
    return "".join(
        str(p.get("content", "")) for p in parts if isinstance(p, dict) and p.get("type") == "text"
    )


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def chat_message(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A parts-form message as OpenAI chat messages (a tool response part becomes a ``tool`` message)."""
    if "parts" not in message:  # already the chat form (older OpenLLMetry)
        return [message]
    parts = [p for p in message.get("parts") or [] if isinstance(p, dict)]
    responses = [p for p in parts if p.get("type") == "tool_call_response"]
    if responses:
        return [
            {"role": "tool", "tool_call_id": p.get("id"), "content": _arguments(p.get("response", ""))}
            for p in responses
        ]
    out: dict[str, Any] = {"role": message.get("role", "user"), "content": _text(parts)}
    calls = [p for p in parts if p.get("type") == "tool_call"]
    if calls:
        out["tool_calls"] = [
            {"id": p.get("id"), "type": "function",
             "function": {"name": p.get("name"), "arguments": _arguments(p.get("arguments", {}))}}
            for p in calls
        ]  # fmt: skip
    return [out]


def tool_definitions(value: Any) -> list[dict[str, Any]] | None:
    """``gen_ai.tool.definitions`` in the chat API's form (``{type: function, function: {...}}``)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, list) or not value:
        return None
    tools = []
    for tool in value:
        if not isinstance(tool, dict):
            continue
        if "function" in tool:
            tools.append(tool)
        else:
            function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
            tools.append({"type": "function", "function": function})
    return tools or None


def _json_list(value: Any) -> list[Any] | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, list) else None


def _event_message(name: str, body: dict[str, Any]) -> dict[str, Any]:
    """A ``gen_ai.{role}.message`` event's body as an OpenAI chat message."""
    role = name.removeprefix("gen_ai.").removesuffix(".message")
    message: dict[str, Any] = {"role": role, "content": body.get("content") or ""}
    if body.get("tool_calls"):
        message["tool_calls"] = body["tool_calls"]
    if role == "tool" and body.get("id"):
        message["tool_call_id"] = body["id"]
    return message


def events_conversation(events: list[Any]) -> Conversation | None:
    """The call's messages from its per-message events (:data:`MESSAGE_EVENTS`, in emission order): the
    ``gen_ai.*.message`` events are the prompt, the first choice the answer; None without content."""
    messages, choices = [], []
    for event in events:
        if not isinstance(event, dict) or event.get("name") not in MESSAGE_EVENT_NAMES:
            continue
        try:
            body = json.loads(event.get("body") or "{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            return None  # content not captured (no body), or not an object: nothing to rebuild
        if event["name"] == "gen_ai.choice":
            choices.append(body)
        else:
            messages.append(_event_message(event["name"], body))
    choices.sort(key=lambda c: c.get("index") or 0)
    answer = choices[0].get("message") if choices else None
    if (
        not messages
        or not isinstance(answer, dict)
        or not (answer.get("content") or answer.get("tool_calls"))
    ):
        return None
    output = {"role": "assistant", "content": answer.get("content") or ""}
    if answer.get("tool_calls"):
        output["tool_calls"] = answer["tool_calls"]
    return Conversation(messages, output)


def conversation(attributes: dict[str, Any]) -> Conversation | None:
    """The call's messages from the parts-form attributes, else from its per-message events; None when
    content was not captured."""
    if sc.GENAI_INPUT_MESSAGES not in attributes and isinstance(attributes.get(MESSAGE_EVENTS), list):
        return events_conversation(attributes[MESSAGE_EVENTS])
    inputs = _json_list(attributes.get(sc.GENAI_INPUT_MESSAGES))
    outputs = _json_list(attributes.get(sc.GENAI_OUTPUT_MESSAGES))
    if not inputs or not outputs or not isinstance(outputs[0], dict):
        return None
    messages = [m for message in inputs if isinstance(message, dict) for m in chat_message(message)]
    system = _json_list(attributes.get(SYSTEM_INSTRUCTIONS))
    if system:
        messages.insert(0, {"role": "system", "content": _text(system)})
    output = chat_message(outputs[0])[0]
    output["role"] = "assistant"
    return Conversation(messages, output, tool_definitions(attributes.get(TOOL_DEFINITIONS)))


ADAPTER = Adapter(
    name="genai",
    match=f"({IS_LLM} OR {IS_REWARD})",
    columns={
        "span_type": f"CASE WHEN {IS_REWARD} THEN '{sc.TYPE_REWARD}' ELSE '{sc.TYPE_LLM}' END",
        "model": attr(sc.GENAI_RESPONSE_MODEL),
        "reward_name": f"CASE WHEN {IS_REWARD} THEN COALESCE({attr(sc.GENAI_EVALUATION_NAME)}, "
        f"'{sc.PRIMARY_REWARD}') END",
        "reward_value": f"CASE WHEN {IS_REWARD} THEN {SCORE} END",
    },
    conversation=conversation,
    finish_reasons=FINISH_REASONS,
    agent_name=AGENT_NAME,
)
