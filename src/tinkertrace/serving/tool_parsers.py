"""Tool-call parsers: the model's tool-call syntax in sampled text turned into OpenAI ``tool_calls``.

Works like vLLM's tool parsers: the whole sampled text is parsed once (the backend returns whole
samples), text before the first call is the message ``content``, and each call becomes
``{"id", "type": "function", "function": {"name", "arguments"}}`` with ``arguments`` a JSON string.
A call that cannot be parsed leaves the whole text as content and marks the choice ``malformed``.
Parsing never changes the token ids: they stay exactly the sampled ones.

Parsers (``--tool-parser``):

- ``hermes`` (alias ``qwen``): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, as
  written by Hermes, Qwen 2.5/3 and the built-in model's template. A last call without its closing
  tag is accepted (sampling may stop right at ``</tool_call>``).
- ``none``: no parsing; tool calls stay in the text.
- ``auto`` (default): ``hermes`` when the chat template writes ``<tool_call>``, else ``none``.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol, get_args

from tinkertrace.serving.settings import ToolParserName

TOOL_PARSERS: tuple[str, ...] = get_args(ToolParserName)


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: ``arguments`` is the JSON text of the arguments object."""

    id: str
    name: str
    arguments: str

    def as_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class ParsedReply:
    """A reply split into content and tool calls; ``malformed`` when a call could not be parsed."""

    content: str | None
    tool_calls: list[ToolCall] = field(default_factory=list)
    malformed: bool = False


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolParser(Protocol):
    """What the endpoint needs from a parser."""

    name: str
    call_start: str  # the text that opens a call (prefilled to force one: tool_choice required/named)
    call_end: str  # the text that closes a call (a stop string when only one call is allowed)

    def parse(self, text: str) -> ParsedReply: ...

    def forced_prefix(self, function_name: str | None) -> str:
        """Text that makes the reply start with a call (of ``function_name`` when given)."""
        ...


class HermesToolParser:
    """``<tool_call>{json}</tool_call>`` blocks (Hermes, Qwen 2.5/3)."""

    name = "hermes"
    call_start = "<tool_call>"
    call_end = "</tool_call>"
    _block = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)\Z", re.DOTALL)

    def parse(self, text: str) -> ParsedReply:
        start = text.find(self.call_start)
        if start < 0:
            return ParsedReply(text)
        calls = []
        for match in self._block.finditer(text, start):
            call = _json_call(match.group(1) if match.group(1) is not None else match.group(2))
            if call is None:
                return ParsedReply(text, malformed=True)
            calls.append(call)
        content = text[:start]
        return ParsedReply(content if content.strip() else None, calls)

    def forced_prefix(self, function_name: str | None) -> str:
        if function_name is None:
            return self.call_start + "\n"
        return self.call_start + "\n" + '{"name": ' + json.dumps(function_name) + ', "arguments": '


def _json_call(body: str) -> ToolCall | None:
    """``{"name": str, "arguments": object}`` (``parameters`` accepted for ``arguments``) or None."""
    try:
        obj = json.loads(body.strip())
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(new_call_id(), obj["name"], json.dumps(args, ensure_ascii=False))


_PARSERS: dict[str, type[HermesToolParser]] = {"hermes": HermesToolParser, "qwen": HermesToolParser}


def make_tool_parser(name: str, chat_template: str | dict[str, str] | None) -> ToolParser | None:
    """The parser named ``name`` (see :data:`TOOL_PARSERS`); None for ``none`` or an ``auto`` that
    finds no known syntax in ``chat_template`` (a template, or Hugging Face's named templates)."""
    if name not in TOOL_PARSERS:
        raise ValueError(f"unknown tool parser {name!r}: choose one of {', '.join(TOOL_PARSERS)}")
    if name == "none":
        return None
    if name == "auto":
        templates = chat_template.values() if isinstance(chat_template, dict) else [chat_template]
        template = "\n".join(t for t in templates if isinstance(t, str))
        return HermesToolParser() if HermesToolParser.call_start in template else None
    return _PARSERS[name]()
