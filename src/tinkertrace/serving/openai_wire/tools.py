"""Function tools and ``tool_choice``, as chat and the Responses API send them.

Tools are kept in chat form, ``[{"type": "function", "function": {"name", "description"?,
"parameters"?}}]``, whatever form they came in (the Responses API's is flat); only ``function``
tools are served (the server cannot run the others).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tinkertrace.serving.openai_wire.errors import (
    checked,
    invalid_type,
    invalid_value,
    missing,
    objects_in,
)

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@dataclass(frozen=True)
class ToolChoice:
    """``tool_choice`` and ``parallel_tool_calls``: ``mode`` is auto, none, required or function
    (then ``name`` is the function that must be called)."""

    mode: str = "none"
    name: str | None = None
    parallel: bool = True


def _function(fn: Any, param: str) -> dict[str, Any]:
    """A validated ``{"name", "description"?, "parameters"?}`` function definition."""
    if not isinstance(fn, dict):
        raise invalid_type(param, "an object", fn)
    name = fn.get("name")
    if name is None:
        raise missing(f"{param}.name")
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise invalid_value(
            f"{param}.name",
            f"{name!r} does not match '^[a-zA-Z0-9_-]{{1,64}}$' (letters, digits, _ and -, at most 64).",
        )
    out: dict[str, Any] = {"name": name}
    if fn.get("description") is not None:
        out["description"] = checked(fn, "description", str)
    if fn.get("parameters") is not None:
        if not isinstance(fn["parameters"], dict):
            raise invalid_type(f"{param}.parameters", "an object (a JSON schema)", fn["parameters"])
        out["parameters"] = fn["parameters"]
    return out


def function_tools(tools: Any, *, nested: bool) -> list[dict[str, Any]] | None:
    """Validated function ``tools`` in chat form (None when absent or empty). ``nested``: chat's
    form; else the Responses API's flat ``{"type": "function", "name", ...}``."""
    if tools is None:
        return None
    out: list[dict[str, Any]] = []
    for param, tool in objects_in(tools, "tools", "an array"):
        if tool.get("type") != "function":
            raise invalid_value(
                f"{param}.type",
                f"tool type {tool.get('type')!r} is not supported by this server; only 'function' tools are.",
                code="unsupported_tool_type",
            )
        if nested and tool.get("function") is None:
            raise missing(f"{param}.function")
        fn = _function(tool["function"], f"{param}.function") if nested else _function(tool, param)
        if any(t["function"]["name"] == fn["name"] for t in out):
            raise invalid_value(param, f"duplicate function name {fn['name']!r}.")
        out.append({"type": "function", "function": fn})
    return out or None


def tool_choice(
    body: dict[str, Any], tools: list[dict[str, Any]] | None, *, named: Callable[[dict[str, Any]], Any]
) -> ToolChoice:
    """``tool_choice`` and ``parallel_tool_calls`` checked against ``tools``; ``named`` reads the
    function name of an object choice (chat nests it in ``function``, Responses does not)."""
    parallel = bool(checked(body, "parallel_tool_calls", bool, True))
    choice = body.get("tool_choice")
    if choice is None:
        return ToolChoice("auto" if tools else "none", None, parallel)
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise invalid_value("tool_choice", f"{choice!r} is not one of 'auto', 'none', 'required'.")
        if choice != "none" and not tools:
            raise invalid_value("tool_choice", f"{choice!r} needs 'tools' to be specified.")
        return ToolChoice(choice, None, parallel)
    if not isinstance(choice, dict):
        raise invalid_type("tool_choice", "a string or an object", choice)
    if choice.get("type") != "function":
        raise invalid_value(
            "tool_choice.type",
            f"{choice.get('type')!r} is not supported by this server; use 'auto', 'none', 'required' or "
            "{'type': 'function', ...}.",
            code="unsupported",
        )
    name = named(choice)
    known = [t["function"]["name"] for t in tools or []]
    if name not in known:
        raise invalid_value(
            "tool_choice",
            f"the function {name!r} is not among the tools given ({', '.join(known) or 'none'}).",
        )
    return ToolChoice("function", name, parallel)
