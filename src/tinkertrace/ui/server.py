"""Running the ui: in the foreground (``tinkertrace ui``) or on a background thread (``demo --ui``,
tests), on a socket bound before the server starts, so the printed URL is always the real one."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import uvicorn
from rich.console import Console

from tinkertrace.ui.app import create_app
from tinkertrace.ui.index import RunIndex
from tinkertrace.ui.settings import UiSettings, ui_url


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        reason = (exc.strerror or str(exc)).lower()  # e.g. "address already in use"
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {reason}") from None
    sock.listen(128)
    return sock


class UiServer:
    """The app over ``paths`` served by uvicorn on its own thread; :attr:`url` once started."""

    def __init__(
        self, paths: Sequence[Path], *, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
        refresh_s: float = 1.0, memory_limit: str = "1GB",
    ) -> None:  # fmt: skip
        if token is not None and not token.strip():
            raise ValueError("an empty token guards nothing: give a real token, or none on a loopback host")
        self.sock = _bind(host, port)  # first: a taken port is said before the (slow) first index
        self.port = int(self.sock.getsockname()[1])
        self.token = token
        self.host = host
        self.index = RunIndex(paths, refresh_s=refresh_s, memory_limit=memory_limit)
        config = uvicorn.Config(
            create_app(self.index, token=token), log_level="warning", access_log=False, lifespan="off"
        )
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return ui_url(self.host, self.port, self.token)

    def start(self, timeout: float = 30.0) -> UiServer:
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])),
            name="tinkertrace-ui",
            daemon=True,
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the ui server did not start on {self.host}:{self.port}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.sock.close()
        self.index.close()

    def __enter__(self) -> UiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def serve_beside(folder: Path, port: int = UiSettings.port) -> Iterator[str]:
    """The ui over ``folder`` (which may not exist yet) on a background thread, for ``demo --ui``:
    yields its URL (printed), on ``port`` or a free one when that is taken."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        server = UiServer([folder], port=port, refresh_s=0.5)
    except OSError:
        server = UiServer([folder], port=0, refresh_s=0.5)
    with server:
        print(f"tinkertrace ui: {server.url}  (follows the run live)", flush=True)
        yield server.url


def serve(
    paths: Sequence[Path], *, host: str, port: int, token: str | None, refresh_s: float, memory_limit: str,
    console: Console,
) -> None:  # fmt: skip
    """Index the run (with a spinner), print the URL, serve until interrupted."""
    with console.status(f"indexing the spans under {', '.join(map(str, paths))}"):
        started = time.monotonic()
        server = UiServer(
            paths, host=host, port=port, token=token, refresh_s=refresh_s, memory_limit=memory_limit
        )
    counts = server.index.counts()
    console.print(
        f"indexed {counts['rollouts']} rollouts ({counts['spans']} spans in {counts['files']} files) "
        f"in {time.monotonic() - started:.1f} s"
    )
    for path, why in sorted(server.index.skipped.items()):
        console.print(f"[yellow]skipped[/yellow] {path}: {why}")
    console.print(f"tinkertrace ui: [bold]{server.url}[/bold]  (Ctrl-C to stop)", highlight=False)
    try:
        asyncio.run(server.server.serve(sockets=[server.sock]))
    except KeyboardInterrupt:
        pass
    finally:
        server.sock.close()
        server.index.close()
