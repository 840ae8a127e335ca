"""The ui's token check: ASGI middleware in front of every page when a token is configured."""

from __future__ import annotations

import hmac
from collections.abc import MutableMapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

TOKEN_COOKIE = "tinkertrace_ui_token"


class TokenGate:
    """Require the token (``Authorization: Bearer``, a ``token`` query parameter, or the cookie the
    latter sets) on every request when one is configured."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.token is None or scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
        given = [
            bearer.strip() if scheme.lower() == "bearer" else "",
            request.query_params.get("token", ""),
            request.cookies.get(TOKEN_COOKIE, ""),
        ]
        if not any(g and hmac.compare_digest(g.encode(), self.token.encode()) for g in given):
            response: Response = Response(
                "This tinkertrace ui needs its token: open the URL it printed (…?token=…) or send "
                "'Authorization: Bearer <token>'.\n",
                status_code=401,
                media_type="text/plain",
            )
            await response(scope, receive, send)
            return

        async def send_with_cookie(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start" and request.query_params.get("token"):
                cookie = f"{TOKEN_COOKIE}={self.token}; HttpOnly; SameSite=Strict; Path=/"
                message["headers"] = [*message.get("headers", []), (b"set-cookie", cookie.encode())]
            await send(message)

        await self.app(scope, receive, send_with_cookie)
