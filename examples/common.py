"""What the example agents share: an OpenAI chat client with the agent's sampling settings, and
tool-call helpers (OpenAI function tools, structured or ``<tool_call>`` text calls).

Plain OpenAI-client code, nothing about training: an agent built on it deploys as is.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from openai import AsyncOpenAI, OpenAI

TEXT_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
ToolCall = tuple[str | None, str, dict[str, Any]]


@dataclass
class Chat:
    """One model behind an OpenAI-compatible endpoint, with default sampling settings.

    Agents take the endpoint as keyword arguments (``base_url``, ``model``, ``api_key``,
    ``temperature``, ``max_tokens``) and pass them here: ``Chat(**endpoint)``.
    """

    base_url: str
    model: str
    api_key: str = "EMPTY"
    temperature: float = 1.0
    max_tokens: int = 24
    client: OpenAI = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.client = OpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=2)

    def _request(self, messages: list[dict[str, Any]], overrides: dict[str, Any]) -> dict[str, Any]:
        settings = {"model": self.model, "temperature": self.temperature, "max_tokens": self.max_tokens}
        return {**settings, **overrides, "messages": messages}

    def complete(self, messages: list[dict[str, Any]], **overrides: Any) -> Any:
        """One chat completion (``overrides``: any ``chat.completions.create`` argument)."""
        return self.client.chat.completions.create(**self._request(messages, overrides))

    def text(self, messages: list[dict[str, Any]], **overrides: Any) -> str:
        """The reply's text ("" when the model said nothing)."""
        return self.complete(messages, **overrides).choices[0].message.content or ""


@dataclass
class AsyncChat(Chat):
    """:class:`Chat` over ``AsyncOpenAI``: ``await chat.complete(...)``."""

    def __post_init__(self) -> None:
        self.client = AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=2)  # type: ignore[assignment]

    async def complete(self, messages: list[dict[str, Any]], **overrides: Any) -> Any:  # type: ignore[override]
        return await self.client.chat.completions.create(**self._request(messages, overrides))  # type: ignore[misc]

    async def text(self, messages: list[dict[str, Any]], **overrides: Any) -> str:  # type: ignore[override]
        return (await self.complete(messages, **overrides)).choices[0].message.content or ""


def user(content: str) -> dict[str, str]:
    """A user message."""
    return {"role": "user", "content": content}


def function_tool(name: str, description: str, **params: str) -> dict[str, Any]:
    """An OpenAI function tool taking the string arguments ``params`` (name → description)."""
    properties = {arg: {"type": "string", "description": text} for arg, text in params.items()}
    schema = {"type": "object", "properties": properties, "required": list(params)}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw or "{}")
        except ValueError:
            return {}
    return raw if isinstance(raw, dict) else {}


def tool_calls(message: Any) -> list[ToolCall]:
    """The tool calls of an assistant message as (call id, name, arguments): structured
    ``tool_calls`` (with their ids), then ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``
    text blocks from servers without tool-call parsing (id None). Malformed calls are skipped."""
    calls: list[ToolCall] = [
        (call.id, call.function.name, _arguments(call.function.arguments))
        for call in message.tool_calls or []
    ]
    for block in TEXT_TOOL_CALL.findall(message.content or ""):
        try:
            parsed = json.loads(block)
            calls.append((None, str(parsed["name"]), _arguments(parsed.get("arguments", {}))))
        except (ValueError, KeyError, TypeError):
            continue
    return calls


def answer_tool_calls(message: Any, calls: list[ToolCall], results: list[str]) -> list[dict[str, Any]]:
    """The messages that put an assistant turn with ``calls`` and their ``results`` into the chat:
    tool messages for structured calls, one user message for text calls."""
    if any(call_id is not None for call_id, _, _ in calls):
        turn = [message.model_dump(exclude_none=True)]
        return turn + [
            {"role": "tool", "tool_call_id": call_id, "content": result}
            if call_id is not None
            else user(f"Tool {name} returned: {result}")
            for (call_id, name, _), result in zip(calls, results, strict=True)
        ]
    text = "\n".join(
        f"Tool {name} returned: {result}" for (_, name, _), result in zip(calls, results, strict=True)
    )
    return [{"role": "assistant", "content": message.content or ""}, user(text)]
