"""The collector's HTTP/1.1 server: uvicorn (httptools parser, uvloop) with the limits a receiver needs.

A :class:`Handler` decides from a request's head alone (:meth:`Handler.admit`): a refusal is answered
before the body is read (uvicorn then drops the body as it arrives and keeps the connection), and a
declared body over ``max_body_bytes`` gets 413 and the connection is closed without reading it. An
admitted body is read, joined and handed to :meth:`Handler.respond`. On top of uvicorn
(:class:`_LimitedProtocol`): a deadline for each request head (from the connection's start, or from a
later request's first byte) and for its body (from the head's end, longer for larger bodies): a client
past it gets 408 and is closed, however slowly it keeps sending; a cap on open connections (503 and
close beyond it). uvicorn's own signal handling is left out: the collector stops the server itself.

The fence: uvicorn's public options cannot set a deadline on a request head (an ASGI app is called
only once the head is complete) nor refuse a connection before it sends anything, so
:class:`_LimitedProtocol` subclasses uvicorn's httptools protocol, which is not public API. It is used
only on the uvicorn versions in :data:`TESTED_UVICORN` (a test pins the installed one there); on any
other version the server runs uvicorn's own protocol through public options (``limit_concurrency``:
503 past the cap; the keep-alive timeout), logs once which deadlines are off, and still serves. The
two paths were measured side by side (``benchmarks/collector_http_protocol.py``).

The server runs its own event loop (uvloop when installed) in a thread of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import typing
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tinkertrace.collector.ingest import name_os_thread
from tinkertrace.netutil import listen_socket

log = logging.getLogger("tinkertrace.collector")

TESTED_UVICORN = ("0.54.",)
"""uvicorn versions whose httptools protocol :class:`_LimitedProtocol` was tested on
(tests/collector/test_http_server.py pins the installed version here)."""


def limited_protocol_supported(version: str = uvicorn.__version__) -> bool:
    """Whether the deadlines' protocol subclass may be used with this uvicorn version."""
    return version.startswith(TESTED_UVICORN)


@dataclass
class Request:
    method: str
    path: str  # without the query string
    headers: dict[bytes, bytes]  # lower-case names; repeated headers joined with ", "
    body: bytes = b""
    reserved: int = 0  # bytes of the handler's memory budget this request holds (see Handler.admit)

    @property
    def content_length(self) -> int | None:
        value = self.headers.get(b"content-length")
        return int(value) if value is not None and value.isdigit() else None


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: bytes = b"text/plain"
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)

    def asgi_start(self, *, close: bool = False) -> dict[str, Any]:
        headers = [(b"content-type", self.content_type), (b"content-length", b"%d" % len(self.body))]
        headers += self.headers + ([(b"connection", b"close")] if close else [])
        return {"type": "http.response.start", "status": self.status, "headers": headers}

    def render(self) -> bytes:
        """The whole response with ``connection: close``, for answers written outside an ASGI cycle."""
        lines = [b"HTTP/1.1 %d %s" % (self.status, _REASONS.get(self.status, b""))]
        lines += [name + b": " + value for name, value in self.asgi_start(close=True)["headers"]]
        return b"\r\n".join(lines) + b"\r\n\r\n" + self.body


_REASONS = {408: b"Request Timeout", 503: b"Service Unavailable"}


class Handler(typing.Protocol):
    def admit(self, request: Request) -> Response | None:
        """Called with the headers (no body yet): a response refuses the request, ``None`` reads the body."""

    def abandon(self, request: Request) -> None:
        """An admitted request will never be answered (its connection was lost or timed out)."""

    def body_too_large(self, request: Request) -> Response:
        """The answer when a body (declared, or a chunked one as it grows) is over ``max_body_bytes``."""

    def respond(self, request: Request) -> Awaitable[Response]:
        """The answer to a request whose body has been read."""


class _LimitedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with deadlines and a connection cap (set per server by
    :meth:`HttpServer._protocol_class`)."""

    limits: HttpServer  # (uvicorn uses self.server for the local address)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._served = 0
        self._timer: asyncio.TimerHandle | None = None
        self._waiting_for = "request head"  # what the armed deadline is for
        if len(self.connections) > self.limits.max_connections:
            busy = Response(503, b"too many open connections", headers=[(b"retry-after", b"1")])
            transport.write(busy.render())
            transport.close()
            return
        self._arm(self.limits.header_timeout_s)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._served:  # a later request: its head's time starts with its first byte
            self._arm(self.limits.header_timeout_s)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._served += 1
        length = dict(self.headers).get(b"content-length", b"0")
        self._arm(self.limits.body_seconds(int(length) if length.isdigit() else 0), "body")

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, seconds: float, waiting_for: str = "request head") -> None:
        self._disarm()
        self._waiting_for = waiting_for
        self._timer = self.loop.call_later(seconds, self._late)

    def _disarm(self) -> None:
        if getattr(self, "_timer", None) is not None:
            self._timer.cancel()  # type: ignore[union-attr]
            self._timer = None

    def _late(self) -> None:
        """A request head or body past its deadline: 408 unless an answer was started, then close."""
        self._timer = None
        if self.transport.is_closing():
            return
        self.limits.timed_out += 1
        answered = self._waiting_for == "body" and self.cycle is not None and self.cycle.response_started
        if not answered:  # (a body refused from its head was answered already: just close)
            late = Response(408, f"the {self._waiting_for} did not arrive in time".encode())
            self.transport.write(late.render())
        self.transport.close()


class _Server(uvicorn.Server):
    """uvicorn's server without its signal capture (which re-raises SIGTERM after shutting down)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpServer:
    """Serves ``handler`` on ``host:port`` from a thread of its own (named ``thread_name``)."""

    def __init__(
        self,
        handler: Handler,
        host: str,
        port: int,
        *,
        max_body_bytes: int,
        keep_alive_s: float = 30.0,
        header_timeout_s: float = 10.0,
        body_timeout_s: float = 30.0,
        min_body_rate: float = 1024 * 1024,
        max_connections: int = 1024,
        thread_name: str = "tt-http",
        limited_protocol: bool | None = None,
    ) -> None:
        self.handler = handler
        self.host = host
        self.port = port
        self.max_body_bytes = max_body_bytes
        self.keep_alive_s = keep_alive_s
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.min_body_rate = min_body_rate
        self.max_connections = max_connections
        self.thread_name = thread_name
        self.limited_protocol = limited_protocol_supported() if limited_protocol is None else limited_protocol
        self.timed_out = 0  # connections closed for a late head or body
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def open_connections(self) -> int:
        return 0 if self._server is None else len(self._server.server_state.connections)

    def body_seconds(self, length: int) -> float:
        """Time allowed for a body of ``length`` bytes, from the end of its head: ``body_timeout_s`` plus
        what ``length`` takes at ``min_body_rate`` bytes/s."""
        return self.body_timeout_s + length / self.min_body_rate

    def start(self) -> None:
        """Listen and serve; returns once listening. Raises ``OSError`` if the port cannot be bound."""
        sock = listen_socket(self.host, self.port, "HTTP", backlog=1024)
        config = uvicorn.Config(
            self._app, loop="none", lifespan="off", log_level="warning", interface="asgi3",
            proxy_headers=False, access_log=False, timeout_keep_alive=int(self.keep_alive_s),
            timeout_graceful_shutdown=10,
            **self._protocol_options(),
        )  # fmt: skip
        server = self._server = _Server(config)
        ready = threading.Event()

        def serve() -> None:
            name_os_thread()
            loop = _new_event_loop()
            asyncio.set_event_loop(loop)
            task = loop.create_task(server.serve(sockets=[sock]))
            loop.call_soon(ready.set)
            try:
                loop.run_until_complete(task)
            finally:
                loop.close()
                ready.set()

        self._thread = threading.Thread(target=serve, name=self.thread_name, daemon=True)
        self._thread.start()
        ready.wait()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop listening, let requests in progress get their answers (up to ``timeout``), then close."""
        if self._server is None or self._thread is None:
            return
        self._server.config.timeout_graceful_shutdown = int(timeout)
        self._server.should_exit = True
        self._thread.join(timeout + 5)

    def _protocol_options(self) -> dict[str, Any]:
        """uvicorn options: the fenced protocol subclass (deadlines, the cap at connect), or uvicorn's
        own httptools protocol with its public ``limit_concurrency``."""
        if self.limited_protocol:
            return {"http": type("LimitedProtocol", (_LimitedProtocol,), {"limits": self})}
        log.warning(
            "the collector's HTTP server runs on uvicorn %s's public options (its deadlines' protocol was "
            "tested on uvicorn %s): serving without the request head and body deadlines (408); past %d "
            "connections requests get 503",
            uvicorn.__version__, ", ".join(TESTED_UVICORN), self.max_connections,
        )  # fmt: skip
        return {"http": "httptools", "limit_concurrency": self.max_connections}

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The ASGI application: admission from the head, then the body, then the handler's answer."""
        if scope["type"] != "http":
            return
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            headers[name] = headers[name] + b", " + value if name in headers else value
        request = Request(scope["method"], scope["path"], headers)
        declared = request.content_length
        if declared is not None and declared > self.max_body_bytes:
            await _send(send, self.handler.body_too_large(request), close=True)  # the body is never read
            return
        response = self.handler.admit(request)
        if response is None:
            body = await self._read_body(request, receive)
            if body is None:  # the client went away
                return
            if len(body) > self.max_body_bytes:  # a chunked body that grew past the limit
                self.handler.abandon(request)
                await _send(send, self.handler.body_too_large(request), close=True)
                return
            request.body = body
            try:
                response = await self.handler.respond(request)
            except Exception:
                log.exception("HTTP handler failed on %s %s", request.method, request.path)
                response = Response(500, b"internal error")
        # 413, or a refused `Expect: 100-continue` request whose client will not send the body: close
        expects_continue = headers.get(b"expect", b"").lower() == b"100-continue"
        await _send(send, response, close=response.status == 413 or (expects_continue and not request.body))

    async def _read_body(self, request: Request, receive: Any) -> bytes | None:
        """The whole body (``None`` if the client went away); reading stops once it is over the limit.
        A body with a declared length that comes in several chunks is gathered into one buffer of that
        size rather than a list of uvicorn's chunks: many small blocks held by stalled bodies would
        leave the heap fragmented (RSS kept after they are freed)."""
        declared = request.content_length
        buffer = bytearray(declared) if declared else None
        chunks: list[bytes] = []  # a chunked body, or a declared one that came in one piece
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.handler.abandon(request)
                return None
            chunk, more = message.get("body", b""), message.get("more_body", False)
            if buffer is None or (size == 0 and not more):
                chunks.append(chunk)
            else:
                buffer[size : size + len(chunk)] = chunk
            size += len(chunk)
            if not more or size > self.max_body_bytes:
                if buffer is None or chunks:
                    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
                return bytes(buffer)


async def _send(send: Any, response: Response, *, close: bool = False) -> None:
    await send(response.asgi_start(close=close))
    await send({"type": "http.response.body", "body": response.body})


def _new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # not available on every platform
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
