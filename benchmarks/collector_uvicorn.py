"""The collector's OTLP/HTTP handler and ingest pipeline served by uvicorn (httptools + uvloop) instead of
the collector's own HTTP server: the other half of ``collector_ingest.py --compare-uvicorn``.

Same ingestor, same handler (``OtlpHttpHandler``: admission from the head, then the pipeline); only the
HTTP/1.1 server differs. An ASGI adapter answers a request refused from its head without reading its
body, reads an admitted body in uvicorn's chunks and joins them.

    .venv/bin/python benchmarks/collector_uvicorn.py --out /tmp/spans --http-port 4318
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tinkertrace.cli.collector_cmd import ALLOCATOR_ENV

for _name, _value in ALLOCATOR_ENV.items():  # as `tinkertrace collector` does, before pyarrow loads
    os.environ.setdefault(_name, _value)

import uvicorn  # noqa: E402

from tinkertrace.collector.http_server import Request, Response  # noqa: E402
from tinkertrace.collector.ingest import IngestConfig, Ingestor  # noqa: E402
from tinkertrace.collector.otlp_http import OtlpHttpHandler  # noqa: E402
from tinkertrace.spanstore.otlp_arrow import warm_up_kernels  # noqa: E402


def asgi_app(handler: OtlpHttpHandler) -> Any:
    """An ASGI application answering through ``handler`` (its ``admit`` / ``respond`` protocol)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            headers[name] = headers[name] + b", " + value if name in headers else value
        request = Request(scope["method"], scope["path"], headers)
        response = handler.admit(request)
        if response is None:
            chunks = []
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    handler.abandon(request)
                    return
                chunks.append(message.get("body", b""))
                if not message.get("more_body"):
                    break
            request.body = b"".join(chunks)
            response = await handler.respond(request)
        await _send(send, response)

    return app


async def _send(send: Any, response: Response) -> None:
    headers = [(b"content-type", response.content_type), *response.headers]
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--http-port", type=int, required=True)
    parser.add_argument("--max-queue-mb", type=float, default=384)
    parser.add_argument("--max-request-mb", type=float, default=64)
    args = parser.parse_args()
    out = args.out.resolve()
    ingestor = Ingestor(
        IngestConfig(
            out=out, wal_dir=out / "_wal" / "uvicorn", instance="uvicorn",
            max_queue_bytes=int(args.max_queue_mb * 2**20),
        )
    )  # fmt: skip
    warm_up_kernels()
    ingestor.recover()
    ingestor.start()
    handler = OtlpHttpHandler(ingestor, max_request_bytes=int(args.max_request_mb * 2**20))
    config = uvicorn.Config(
        asgi_app(handler), host="127.0.0.1", port=args.http_port, http="httptools", loop="uvloop",
        lifespan="off", log_level="warning", access_log=False,
    )  # fmt: skip
    server = _Server(config)
    signal.signal(signal.SIGTERM, lambda signum, frame: setattr(server, "should_exit", True))
    signal.signal(signal.SIGINT, lambda signum, frame: setattr(server, "should_exit", True))
    try:
        server.run()
    finally:
        ingestor.stop()  # everything acknowledged goes to Parquet, as `tinkertrace collector` does


class _Server(uvicorn.Server):
    """uvicorn's server without its signal capture, which re-raises SIGTERM after shutting down and so
    would end the process before the ingestor flushes."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


if __name__ == "__main__":
    main()
