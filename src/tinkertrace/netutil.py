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


GRACEFUL_SHUTDOWN_S = 5.0
"""How long a stopping :class:`BackgroundServer` lets requests in flight finish before cancelling them."""


class BackgroundServer:
    """Run an ASGI app with uvicorn in a daemon thread: ``with BackgroundServer(app) as srv: srv.url``."""

    def __init__(self, app: Any, host: str = LOOPBACK, port: int | None = None, **uvicorn_options: Any):
        import uvicorn

        self.host = host
        self.port = port or free_port(host)
        uvicorn_options.setdefault("timeout_graceful_shutdown", GRACEFUL_SHUTDOWN_S)
        config = uvicorn.Config(
            app, host=host, port=self.port, log_level="warning", lifespan="on", **uvicorn_options
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name=f"uvicorn:{self.port}", daemon=True)

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
        self._thread.join(timeout=GRACEFUL_SHUTDOWN_S + 30)
        if self._thread.is_alive():
            raise RuntimeError(f"the server on {self.url} did not stop")

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
