"""Around every route of the endpoint and the proxy: authentication (``Authorization: Bearer KEY`` or
Anthropic's ``x-api-key: KEY``), errors in each API's shape (OpenAI's; Anthropic's on ``/v1/messages``),
and (for LLM routes, with a recorder) the call recorded as an LLM span."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from tinkertrace.sdk.llm_call import call_kind
from tinkertrace.serving.openai_wire.errors import ApiError
from tinkertrace.serving.recording import CallRecorder

log = logging.getLogger(__name__)

Handler = Callable[[Request], Awaitable[Response]]
"""A route's handler, as the guard wraps it."""


def presented_token(request: Request) -> str | None:
    """The key a request presents: its ``Authorization: Bearer`` token, else its ``x-api-key`` header
    (what Anthropic's clients send)."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.headers.get("x-api-key", "").strip() or None


def check_token(request: Request, expected: str, what: str) -> None:
    """A 401 :class:`ApiError` unless the request presents ``expected`` (``what``: "API key", ...)."""
    token = presented_token(request)
    if token is None:
        raise ApiError(
            401,
            f"You didn't provide an {what}. Send it in an 'Authorization: Bearer ...' header (or, as "
            "Anthropic's clients do, in 'x-api-key').",
            code="invalid_api_key",
        )
    if not hmac.compare_digest(token.encode(), expected.encode()):
        shown = token[:3] + "*" * max(0, len(token) - 7) + token[-4:] if len(token) > 8 else "***"
        raise ApiError(401, f"Incorrect {what} provided: {shown}.", code="invalid_api_key")


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's 404 / 405 as JSON errors naming the path the client sent."""
    assert isinstance(exc, HTTPException)
    path = request.url.path
    message = {
        404: f"Unknown request URL: {request.method} {path}.",
        405: f"Method {request.method} is not allowed for {path}.",
    }.get(exc.status_code, str(exc.detail))
    if exc.status_code == 404 and path.startswith("/rollouts/"):
        message += " A rollout prefix is followed by /v1: http://HOST:PORT/rollouts/{rollout_id}/v1/..."
    code = {404: "unknown_url", 405: "method_not_allowed"}.get(exc.status_code)
    return ApiError(exc.status_code, message, code=code).response(path)


def guarded(
    handler: Handler,
    authenticate: Callable[[Request], None],
    recorder: CallRecorder | None = None,
) -> Handler:
    """``handler`` behind ``authenticate`` (raises :class:`ApiError`), every failure answered in the
    route's API's error shape; with a ``recorder``, an LLM request and its answer (errors included)
    recorded."""

    async def run(request: Request) -> Response:
        call = None
        try:
            authenticate(request)
            kind = call_kind(request.url.path) if recorder and request.method == "POST" else None
            if kind is not None:
                assert recorder is not None
                call = await recorder.open_call(request, kind)
            response = await handler(request)
        except ApiError as err:
            response = err.response(request.url.path)
        except ValueError as exc:  # the sampler refused the request (e.g. a prompt beyond the context)
            response = ApiError(400, f"The sampler rejected the request: {exc}").response(request.url.path)
        except Exception as exc:
            log.exception("request to %s failed", request.url.path)
            failed = ApiError(500, f"The server failed to answer: {exc}", type="server_error")
            response = failed.response(request.url.path)
        if call is not None:
            assert recorder is not None
            return await recorder.close_call(call, response)
        return response

    return run
