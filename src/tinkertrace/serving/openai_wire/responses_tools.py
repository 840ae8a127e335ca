"""The Responses API's ``tools`` as harnesses send them: functions, namespaces and hosted tools.

* ``function`` tools are served as they are.
* ``namespace`` tools (``{"type": "namespace", "name": NS, "description", "tools": [function, ...]}``,
  ``openai.types.responses.NamespaceTool``) group functions: each is offered to the model under its
  qualified name ``NS__FUNCTION`` (the form Codex CLI gives its MCP tools), and a call of one comes
  back as OpenAI answers it, a ``function_call`` item with ``name`` FUNCTION and ``namespace`` NS.
  A ``function_call`` input item with a ``namespace`` is rendered under the qualified name again, so
  the history reads as the model wrote it.
* Every other tool type (hosted tools such as ``web_search``, ``file_search``, ``code_interpreter``,
  ``image_generation``, ``mcp``; and the freeform ``custom`` tools, also inside a namespace) is
  **left out of the prompt**, and the call's recorded span says which (attribute
  :data:`TOOLS_LEFT_OUT`). The endpoint cannot run a hosted tool, and the upstream API never asks
  the caller to: refusing would stop every harness that offers one by default (Codex CLI sends
  ``web_search`` on every request), while leaving it out only means the model does not call it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from tinkertrace.serving.openai_wire.errors import ApiError, invalid_type, invalid_value, missing, objects_in
from tinkertrace.serving.openai_wire.tools import function_tools

NAMESPACE_SEPARATOR = "__"
TOOLS_LEFT_OUT = "tinkertrace.serving.tools_left_out"
"""Span attribute: the request's tools left out of the prompt, e.g. ``tools[4] (web_search)``."""


@dataclass(frozen=True)
class ResponsesTools:
    """A request's tools: ``functions`` in chat form (what the model is offered, namespaced ones under
    their qualified names), ``namespaced`` (qualified name -> (namespace, function name)) and
    ``left_out`` (the tools not offered, as ``tools[i] (type)``)."""

    functions: list[dict[str, Any]] | None
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)
    left_out: tuple[str, ...] = ()

    def call_fields(self, name: str) -> dict[str, str]:
        """A ``function_call`` output item's ``name`` (and ``namespace``) for a call of ``name``."""
        if name in self.namespaced:
            namespace, function = self.namespaced[name]
            return {"name": function, "namespace": namespace}
        return {"name": name}


NO_TOOLS = ResponsesTools(None)


def qualified(namespace: str, function: str) -> str:
    """The name a namespaced function is offered to the model under."""
    return f"{namespace}{NAMESPACE_SEPARATOR}{function}"


def _namespace_functions(tool: dict[str, Any], param: str) -> tuple[list[dict[str, Any]], list[str]]:
    """A namespace's functions (flat Responses form, qualified names) and its tools left out."""
    namespace = tool.get("name")
    if namespace is None:
        raise missing(f"{param}.name")
    if not isinstance(namespace, str) or not namespace:
        raise invalid_type(f"{param}.name", "a non-empty string", namespace)
    if tool.get("tools") is None:
        raise missing(f"{param}.tools")
    functions, left_out = [], []
    for inner_param, inner in objects_in(tool["tools"], f"{param}.tools", "an array"):
        if inner.get("type") != "function":
            left_out.append(f"{inner_param} ({inner.get('type')})")
            continue
        name = inner.get("name")
        if not isinstance(name, str):
            raise invalid_type(f"{inner_param}.name", "a string", name)
        functions.append({**inner, "name": qualified(namespace, name), "_namespace": (namespace, name)})
    return functions, left_out


def responses_tools(tools: Any) -> ResponsesTools:
    """Validated Responses ``tools`` (module docstring); raises :class:`~.errors.ApiError`."""
    if tools is None:
        return ResponsesTools(None)
    flat: list[dict[str, Any]] = []
    namespaced: dict[str, tuple[str, str]] = {}
    left_out: list[str] = []
    for param, tool in objects_in(tools, "tools", "an array"):
        kind = tool.get("type")
        if not isinstance(kind, str):
            raise invalid_type(f"{param}.type", "a string", kind)
        if kind == "function":
            flat.append(tool)
        elif kind == "namespace":
            functions, skipped = _namespace_functions(tool, param)
            for fn in functions:
                namespaced[fn["name"]] = fn.pop("_namespace")
            flat += functions
            left_out += skipped
        else:
            left_out.append(f"{param} ({kind})")
    try:
        offered = function_tools(flat, nested=False)
    except ApiError as exc:  # say how a namespaced function was named when that is what failed
        if namespaced and "duplicate function name" in exc.message:
            hint = (
                f"{exc.message} (a namespaced function is offered as NAMESPACE{NAMESPACE_SEPARATOR}FUNCTION)"
            )
            raise invalid_value(exc.param or "tools", hint) from None
        raise
    return ResponsesTools(offered, namespaced, tuple(left_out))


def qualify_input(value: Any) -> Any:
    """``input`` with each ``function_call`` item that names a ``namespace`` renamed to its qualified
    name (the name the model wrote the call under); anything else as it is."""
    if not isinstance(value, list):
        return value
    out = []
    for item in value:
        if (
            isinstance(item, dict)
            and item.get("type") == "function_call"
            and isinstance(item.get("namespace"), str)
            and isinstance(item.get("name"), str)
        ):
            item = {**item, "name": qualified(item["namespace"], item["name"])}
        out.append(item)
    return out


def chosen_name(choice: dict[str, Any]) -> Any:
    """The function an object ``tool_choice`` names (qualified when it names a ``namespace``)."""
    name, namespace = choice.get("name"), choice.get("namespace")
    return qualified(namespace, name) if isinstance(namespace, str) and isinstance(name, str) else name


def note_left_out(request: Request, left_out: tuple[str, ...]) -> None:
    """Record on the call's span (when it is recorded) which tools were left out of the prompt."""
    call = getattr(request.state, "llm_call", None)
    if left_out and call is not None:
        call.span.context_attributes[TOOLS_LEFT_OUT] = ", ".join(left_out)
