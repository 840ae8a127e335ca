"""Request body limits of the endpoint and the proxy, before anything reads the body.

:class:`BodyLimit` (ASGI middleware, outermost) answers a body over ``max_bytes`` with a 413: at once
when its ``Content-Length`` says so (nothing is read), else as soon as the bytes received pass the
limit (a chunked body). A client that takes longer than ``timeout_s`` to send its body gets a 408.
A body within the limits is read whole (at most ``max_bytes`` held per request) and handed on, so
no route, tokenizer or recorder ever sees more; memory stays bounded by concurrency x limit.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from tinkertrace.serving.openai_wire.errors import ApiError

MIB = 1024 * 1024


@dataclass
class RequestLimits:
    """The limits (``--max-request-mb``, ``--request-timeout``) and how many requests they refused."""

    max_bytes: int = 4 * MIB
    timeout_s: float = 60.0
    refused: dict[int, int] = field(default_factory=dict)  # status (413, 408) -> count, for /health
    largest_read: int = 0  # the most body bytes one request had buffered (a refused one's included)


class BodyLimit:
    """ASGI middleware: 413 over ``limits.max_bytes``, 408 past ``limits.timeout_s`` (module docstring)."""

    def __init__(self, app: Any, limits: RequestLimits) -> None:
        self.app = app
        self.limits = limits
        self.max_bytes = limits.max_bytes
        self.timeout_s = limits.timeout_s

    def _too_large(self, size: str) -> ApiError:
        limit = f"{self.max_bytes / MIB:.3g} MiB ({self.max_bytes} bytes)"
        return ApiError(
            413,
            f"The request body ({size}) is over this server's limit of {limit}; the limit is set with "
            "--max-request-mb.",
            code="request_too_large",
        )

    async def _read(self, receive: Any) -> bytes:
        """The whole body, or an :class:`ApiError` (413 past the limit, 408 past the deadline)."""
        body = bytearray()
        try:
            async with asyncio.timeout(self.timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise ConnectionResetError("client went away while sending its body")
                    body += message.get("body", b"")
                    self.limits.largest_read = max(self.limits.largest_read, len(body))
                    if len(body) > self.max_bytes:
                        raise self._too_large(f"more than {len(body)} bytes so far")
                    if not message.get("more_body", False):
                        return bytes(body)
        except TimeoutError:
            raise ApiError(
                408,
                f"The request body did not arrive within {self.timeout_s:g} s ({len(body)} bytes received).",
                type="timeout_error",
                code="request_timeout",
            ) from None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        try:
            if declared.isdigit() and int(declared) > self.max_bytes:
                raise self._too_large(f"{int(declared)} bytes")
            body = await self._read(receive)
        except ApiError as err:
            self.limits.refused[err.status] = self.limits.refused.get(err.status, 0) + 1
            await err.response(scope["path"])(scope, receive, send)
            return
        except ConnectionResetError:
            return
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return dict(await receive())  # after the body: the disconnect, when it comes

        await self.app(scope, replay, send)
