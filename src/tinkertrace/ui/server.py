"""Running the ui: in the foreground (``tinkertrace ui``) or on a background thread (``demo --ui``,
tests), on a socket bound before the server starts, so the printed URL is always the real one."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console

from tinkertrace.netutil import LOOPBACK, BackgroundServer, listen_socket
from tinkertrace.ui.app import create_app
from tinkertrace.ui.index import RunIndex
from tinkertrace.ui.settings import UiSettings, ui_url


class UiServer:
    """The app over ``paths`` served by uvicorn on its own thread; :attr:`url` once started."""

    def __init__(
        self, paths: Sequence[Path], *, host: str = LOOPBACK, port: int = 0, token: str | None = None,
        refresh_s: float = 1.0, memory_limit: str = "1GB",
    ) -> None:  # fmt: skip
        if token is not None and not token.strip():
            raise ValueError("an empty token guards nothing: give a real token, or none on a loopback host")
        sock = listen_socket(host, port)  # first: a taken port is said before the (slow) first index
        self.port = int(sock.getsockname()[1])
        self.token = token
        self.host = host
        try:
            self.index = RunIndex(paths, refresh_s=refresh_s, memory_limit=memory_limit)
        except BaseException:
            sock.close()
            raise
        app = create_app(self.index, token=token)
        self.server = BackgroundServer(app, sock=sock, lifespan="off", access_log=False)

    @property
    def url(self) -> str:
        return ui_url(self.host, self.port, self.token)

    def start(self) -> UiServer:
        self.server.start()
        return self

    def stop(self) -> None:
        """Stop serving (requests in flight get the graceful shutdown's time), then close the index."""
        try:
            self.server.stop()
        finally:
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
        server.server.serve_here()
    except KeyboardInterrupt:
        pass
    finally:
        server.index.close()
