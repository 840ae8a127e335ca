"""Loopback networking helpers shared by servers, tests, benchmarks and the demo."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

LOOPBACK = "127.0.0.1"
"""Where every server of tinkertrace listens unless told otherwise."""


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on ``host`` right now."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """``count`` different TCP ports that are free on ``host`` right now (two calls of
    :func:`free_port` may return the same port: nothing holds it in between)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def wait_for_port(port: int, host: str = LOOPBACK, timeout: float = 30.0) -> None:
    """Block until something accepts TCP connections on ``host:port``; TimeoutError otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing listens on {host}:{port} after {timeout:.0f}s") from None
            time.sleep(0.05)


def listen_socket(host: str, port: int, what: str = "", backlog: int = 128) -> socket.socket:
    """A socket bound to ``host:port`` and listening (port 0: a free one), so a server's printed URL is
    the real one and a taken port is said at once: OSError ``cannot listen [for WHAT] on HOST:PORT:
    <reason>``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        reason = (exc.strerror or str(exc)).lower()  # e.g. "address already in use"
        purpose = f" for {what}" if what else ""
        raise OSError(exc.errno, f"cannot listen{purpose} on {host}:{port}: {reason}") from None
    sock.listen(backlog)
    return sock


GRACEFUL_SHUTDOWN_S = 5.0
"""How long a stopping :class:`BackgroundServer` lets requests in flight finish before cancelling them."""


class BackgroundServer:
    """Run an ASGI app with uvicorn in a daemon thread: ``with BackgroundServer(app) as srv: srv.url``.

    On ``sock`` (from :func:`listen_socket`) when given, which it then owns and closes; else on
    ``host:port`` (port ``None``: a free one)."""

    def __init__(
        self, app: Any, host: str = LOOPBACK, port: int | None = None, *, sock: socket.socket | None = None,
        **uvicorn_options: Any,
    ) -> None:  # fmt: skip
        import uvicorn

        self.sock = sock
        self.host = host if sock is None else str(sock.getsockname()[0])
        self.port = int(sock.getsockname()[1]) if sock is not None else port or free_port(host)
        uvicorn_options.setdefault("timeout_graceful_shutdown", GRACEFUL_SHUTDOWN_S)
        uvicorn_options.setdefault("lifespan", "on")
        config = uvicorn.Config(app, host=self.host, port=self.port, log_level="warning", **uvicorn_options)
        self._server = uvicorn.Server(config)
        sockets = None if sock is None else [sock]
        self._thread = threading.Thread(
            target=lambda: self._server.run(sockets=sockets), name=f"uvicorn:{self.port}", daemon=True
        )

    def serve_here(self) -> None:
        """Serve in the calling thread until interrupted (Ctrl-C), then close the socket."""
        try:
            self._server.run(sockets=None if self.sock is None else [self.sock])
        finally:
            if self.sock is not None:
                self.sock.close()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server on {self.url} failed to start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Ask uvicorn to exit and wait for its thread: requests in flight get
        :data:`GRACEFUL_SHUTDOWN_S` to finish, then the app's shutdown runs."""
        self._server.should_exit = True
        if self._thread.ident is not None:
            self._thread.join(timeout=GRACEFUL_SHUTDOWN_S + 30)
        if self.sock is not None:
            self.sock.close()
        if self._thread.is_alive():
            raise RuntimeError(f"the server on {self.url} did not stop")

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
