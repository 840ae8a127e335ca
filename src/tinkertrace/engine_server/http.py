"""Errors and authentication of ``tinkertrace engine``, in the shapes the ``tinker`` SDK expects."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from tinkertrace.engine_server.downloads import DOWNLOADS_PREFIX
from tinkertrace.engine_server.state import UnknownResourceError
from tinkertrace.engine_server.wire import WireError
from tinkertrace.training.backends import HEALTH_PATH

API_KEY_PREFIX = "tml-"
log = logging.getLogger("tinkertrace.engine")
"""The request log: one line per refused request or failed call (route, status, reason)."""

USER_ERRORS = (ValueError, TypeError, LookupError, OSError, NotImplementedError)
"""Exceptions that are the caller's to fix (category ``user``); anything else is ``server``."""


class ApiError(ValueError):
    """A request refused before it ran: answered with ``status`` and ``{"detail": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def error_response(status: int, message: str, route: str) -> JSONResponse:
    """Tinker's error body; ``x-should-retry: false`` tells the SDK not to retry it. Logged as one
    line (route, status, reason)."""
    log.warning("%s refused %d: %s", route, status, message)
    return JSONResponse({"detail": message}, status_code=status, headers={"x-should-retry": "false"})


def _status_of(exc: Exception) -> int:
    if isinstance(exc, ApiError):
        return exc.status
    if isinstance(exc, LookupError | FileNotFoundError):
        return 404
    return 400


class ApiKeyMiddleware:
    """Checks ``X-API-Key`` (or ``Authorization: Bearer``) on every route but the health check and
    the signed download URLs."""

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app = app
        self.api_key = api_key

    def accepts(self, key: str | None) -> bool:
        if not key:
            return False
        return key == self.api_key if self.api_key is not None else key.startswith(API_KEY_PREFIX)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] == "http" and path != HEALTH_PATH and not path.startswith(DOWNLOADS_PREFIX):
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            key = headers.get("x-api-key")
            if key is None and headers.get("authorization", "").lower().startswith("bearer "):
                key = headers["authorization"][7:].strip()
            if not self.accepts(key):
                wanted = "the key given to `tinkertrace engine --api-key`" if self.api_key else "a tml- key"
                message = f"invalid or missing API key (X-API-Key): expected {wanted}"
                response = error_response(401, message, f"{scope['method']} {path}")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def guard(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """Turn refusals (bad body, unknown ids, engine ValueErrors) into Tinker-style error responses, and
    anything unexpected into a logged 500."""

    async def guarded(request: Request) -> Response:
        route = f"{request.method} {request.url.path}"
        try:
            return await handler(request)
        except (ApiError, WireError, UnknownResourceError, *USER_ERRORS) as exc:
            return error_response(_status_of(exc), str(exc), route)
        except Exception as exc:
            log.exception("%s failed", route)
            return error_response(500, f"internal error: {type(exc).__name__}: {exc}", route)

    return guarded
