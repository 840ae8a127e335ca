"""How one request uses tools: what is added to the prompt and stop strings, and how replies are parsed.

``tool_choice`` is honoured without constrained decoding, by what the model is given to continue:

- ``auto``: replies are parsed; the model decides.
- ``none``: replies are not parsed (tools are still rendered, as vLLM does by default).
- ``required``: the generation prompt ends with the parser's call opening (``<tool_call>\\n``), so
  the reply is a call; one that does not parse is malformed.
- a named function: the prompt ends with the call's opening up to its arguments
  (``<tool_call>\\n{"name": "f", "arguments": ``), so the model writes only the arguments. They are
  read as the first JSON value it writes (what follows that value is ignored: the call is already
  named). Where that is unambiguous, what small models write is accepted as a schema-guided decoder
  would have forced it: a bare value (``"arguments": 4}``) for a function with exactly one
  parameter is that parameter's value, and a number or boolean given for a ``string`` parameter is
  its JSON text (``4`` becomes ``"4"``). Anything else that is not an object is malformed.

The forced opening is part of the prompt (it is in ``prompt_token_ids``) and is put back in front
of the sampled text before parsing; ``token_ids`` stay exactly the sampled tokens.
``parallel_tool_calls: false`` adds the call's closing tag as a stop string, so at most one call is
sampled. A reply whose calls do not parse keeps its whole text as content, with ``finish_reason``
``malformed_tool_call`` (``length`` when it was cut by ``max_tokens``).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from tinkertrace.serving.openai_wire.completions import Choice
from tinkertrace.serving.openai_wire.errors import ApiError
from tinkertrace.serving.openai_wire.requests import SamplingOptions
from tinkertrace.serving.openai_wire.tools import ToolChoice
from tinkertrace.serving.tool_parsers import ToolCall, ToolParser, new_call_id

FINISH_TOOL_CALLS = "tool_calls"
FINISH_MALFORMED = "malformed_tool_call"


@dataclass(frozen=True)
class ToolPlan:
    """The tool handling of one request (see the module docstring)."""

    parser: ToolParser | None = None
    prefix: str = ""
    single_call: bool = False
    named: dict[str, Any] | None = None  # the named function (tool_choice), its arguments read leniently

    @property
    def forced(self) -> bool:
        return bool(self.prefix)

    def options(self, options: SamplingOptions) -> SamplingOptions:
        """``options`` with the call's closing tag as a stop string when one call is allowed."""
        if not (self.single_call and self.parser):
            return options
        return dataclasses.replace(options, stop=(*options.stop, self.parser.call_end))

    def apply(self, choice: Choice) -> Choice:
        """``choice`` with its text split into content and tool calls (token ids untouched)."""
        if self.parser is None:
            return choice
        text = self.prefix + choice.text
        if self.named is not None:
            call = named_call(self.named, choice.text)
            if call is not None:
                return dataclasses.replace(
                    choice, text="", tool_calls=(call,), finish_reason=FINISH_TOOL_CALLS
                )
        parsed = self.parser.parse(text)
        if parsed.malformed or (self.forced and not parsed.tool_calls):
            finish = choice.finish_reason if choice.finish_reason == "length" else FINISH_MALFORMED
            return dataclasses.replace(choice, text=text, finish_reason=finish)
        if not parsed.tool_calls:
            return choice
        calls = parsed.tool_calls[:1] if self.single_call else parsed.tool_calls
        return dataclasses.replace(
            choice, text=parsed.content or "", tool_calls=tuple(calls), finish_reason=FINISH_TOOL_CALLS
        )


def plan_tools(parser: ToolParser | None, tools: list | None, choice: ToolChoice) -> ToolPlan:
    """The :class:`ToolPlan` for a request with ``tools`` and ``choice`` on a server with ``parser``."""
    if not tools or choice.mode == "none":
        return ToolPlan()
    if parser is None:
        if choice.mode in ("required", "function"):
            raise ApiError(
                400,
                f"tool_choice {choice.name or choice.mode!r} needs a tool parser, and this server has "
                "none: start it with --tool-parser (see `tinkertrace serve --help`).",
                param="tool_choice",
                code="unsupported",
            )
        return ToolPlan()
    prefix = parser.forced_prefix(choice.name) if choice.mode in ("required", "function") else ""
    named = next((t["function"] for t in tools if t["function"]["name"] == choice.name), None)
    single = not choice.parallel or choice.mode == "function"
    return ToolPlan(parser, prefix, single_call=single, named=named if choice.mode == "function" else None)


def named_call(function: dict[str, Any], text: str) -> ToolCall | None:
    """The call of ``function`` whose arguments are the first JSON value in ``text`` (see the module
    docstring for what is accepted); None when there is none to read."""
    try:
        value, _ = json.JSONDecoder().raw_decode(text.lstrip())
    except ValueError:
        return None
    properties = (function.get("parameters") or {}).get("properties") or {}
    if not isinstance(value, dict):
        if len(properties) != 1:
            return None
        value = {next(iter(properties)): value}
    for key, schema in properties.items():
        scalar = isinstance(value.get(key), (int, float, bool))
        if scalar and isinstance(schema, dict) and schema.get("type") == "string":
            value[key] = json.dumps(value[key])
    return ToolCall(new_call_id(), function["name"], json.dumps(value, ensure_ascii=False))
