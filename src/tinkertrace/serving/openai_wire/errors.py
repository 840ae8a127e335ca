"""Errors in each API's shape, the checks that raise them, and reading a JSON request body.

An :class:`ApiError` carries the HTTP status and the message; :meth:`ApiError.response` answers it in
OpenAI's shape (``{"error": {"message", "type", "param", "code"}}``) or, on Anthropic's
``/v1/messages``, in Anthropic's (``{"type": "error", "error": {"type", "message"}}``, the type named
by the status). Validation messages follow OpenAI's wording (``Invalid type for 'n': expected an
integer, but got a string instead.``).
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse

_JSON_NAMES = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "an array",
    dict: "an object",
    type(None): "null",
}
# Anthropic's error types by HTTP status (its API reference, "Errors"); others are api_error
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def speaks_anthropic(path: str) -> bool:
    """Whether a request path is Anthropic's Messages API (its errors are answered in its shape)."""
    return path.rstrip("/").endswith("/v1/messages")


def context_length_exceeded(prompt_tokens: int, limit: int, *, responses: bool = False) -> ApiError:
    """OpenAI's answer to a prompt that does not fit the model's context: chat and completions word it
    as OpenAI's chat API does (``param`` ``messages``), the Responses API as its own (``param``
    ``input``); both HTTP 400 with code ``context_length_exceeded``, which clients (Codex CLI, the
    Agents SDK) read as "compact the history"."""
    if responses:
        message = (
            "Your input exceeds the context window of this model. Please adjust your input and try "
            f"again. ({prompt_tokens} input tokens; the context holds {limit}.)"
        )
    else:
        message = (
            f"This model's maximum context length is {limit} tokens. However, your messages resulted in "
            f"{prompt_tokens} tokens. Please reduce the length of the messages."
        )
    param = "input" if responses else "messages"
    return ApiError(400, message, param=param, code="context_length_exceeded")


class ApiError(Exception):
    """An error answered to the client in OpenAI's format."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict[str, Any]:
        kind = _ANTHROPIC_TYPES.get(
            self.status, "invalid_request_error" if self.status < 500 else "api_error"
        )
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def response(self, path: str = "") -> JSONResponse:
        """The error as a JSON response: Anthropic's shape when ``path`` is ``/v1/messages``."""
        body = self.anthropic_body() if speaks_anthropic(path) else self.body()
        return JSONResponse(body, status_code=self.status)


def json_kind(value: Any) -> str:
    """The JSON type of ``value`` as OpenAI's messages name it (``an integer``, ``null``, ...)."""
    return _JSON_NAMES.get(type(value), type(value).__name__)


def invalid_type(param: str, expected: str, value: Any) -> ApiError:
    return ApiError(
        400,
        f"Invalid type for '{param}': expected {expected}, but got {json_kind(value)} instead.",
        param=param,
        code="invalid_type",
    )


def invalid_value(param: str, message: str, code: str = "invalid_value") -> ApiError:
    """A value out of range, or one this server does not serve (``code="unsupported"``...)."""
    return ApiError(400, f"Invalid value for '{param}': {message}", param=param, code=code)


def missing(param: str) -> ApiError:
    return ApiError(
        400, f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter"
    )


def checked(
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
        raise invalid_type(name, _JSON_NAMES[kind], value)
    if minimum is not None and value < minimum:
        raise invalid_value(name, f"expected a value >= {minimum}, but got {value} instead.")
    if maximum is not None and value > maximum:
        raise invalid_value(name, f"expected a value <= {maximum}, but got {value} instead.")
    return value


def objects_in(value: Any, name: str, expected: str) -> list[tuple[str, dict[str, Any]]]:
    """The items of the array ``value`` (``name``), each an object, with its param (``name[i]``)."""
    if not isinstance(value, list):
        raise invalid_type(name, expected, value)
    items = []
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise invalid_type(f"{name}[{i}]", "an object", item)
        items.append((f"{name}[{i}]", item))
    return items


def require_object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, f"The request body must be a JSON object, but got {json_kind(body)}.")
    return body


async def read_json(request: Request) -> Any:
    """The request's JSON body; a 400 :class:`ApiError` when it is not JSON."""
    raw = await request.body()
    try:
        return orjson.loads(raw)  # nesting deeper than 1024 levels is a decode error, not a crash
    except orjson.JSONDecodeError as exc:
        raise ApiError(
            400,
            f"We could not parse the JSON body of your request ({exc}). The body must be a JSON object "
            "sent with 'Content-Type: application/json'.",
        ) from exc
