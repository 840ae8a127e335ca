"""Server CPU to receive one large OTLP request: the collector's HTTP server against uvicorn.

Each server runs as its own process pinned to CPU 0 and answers every POST with an empty 200 after
reading the whole body; an httpx client on the other CPU posts one realistic 512-span request
(~1.4 MB) after another. Prints the server's CPU (user + system, from ``/proc``) per request and per
span. Only the HTTP layer is measured: no conversion, WAL or Parquet.

A fresh process maps and zeroes new pages for every 1.4 MB buffer (glibc returns large blocks to the
kernel on free), which on this VM costs more than the HTTP work itself; a running collector's heap
is warm. So by default the servers run with glibc's mmap/trim thresholds raised (``GLIBC_TUNABLES``),
which reproduces the warm heap; ``--cold-allocator`` measures with the defaults.

    .venv/bin/python benchmarks/collector_http.py --seconds 4 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
from collector_ingest import _cpu_seconds  # this folder is on sys.path when a script here runs

from tinkertrace.netutil import free_port, wait_for_port
from tinkertrace.spanstore.samples import llm_request

SPANS = 512
SERVERS = ("uvicorn", "collector")
WARM_HEAP = "glibc.malloc.mmap_threshold=67108864:glibc.malloc.trim_threshold=268435456"


class _Drain:
    """Handler for the collector's server: read the body, answer 200."""

    def admit(self, request: Any) -> None:
        return None

    def abandon(self, request: Any) -> None:
        pass

    def body_too_large(self, request: Any) -> Any:
        raise AssertionError("no limit is reached here")

    async def respond(self, request: Any) -> Any:
        from tinkertrace.collector.http_server import Response

        return Response(200, b"", b"application/x-protobuf")


async def _asgi_drain(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The same for uvicorn, as the collector's ASGI app read bodies before."""
    if scope["type"] != "http":
        return
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    b"".join(chunks)
    headers = [(b"content-type", b"application/x-protobuf"), (b"content-length", b"0")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b""})


def _serve(kind: str, port: int) -> None:
    if kind == "uvicorn":
        import uvicorn

        uvicorn.run(
            _asgi_drain, host="127.0.0.1", port=port, log_level="warning", http="httptools", loop="uvloop"
        )
        return
    from tinkertrace.collector.http_server import HttpServer

    HttpServer(_Drain(), "127.0.0.1", port, max_body_bytes=64 << 20).start()
    threading.Event().wait()  # serve until killed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=4.0, help="how long to post to each server")
    parser.add_argument("--rounds", type=int, default=2, help="times to measure each server (interleaved)")
    parser.add_argument(
        "--cold-allocator", action="store_true", help="glibc's default thresholds (pages mapped per request)"
    )
    parser.add_argument("--serve", nargs=2, metavar=("KIND", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve(args.serve[0], int(args.serve[1]))
        return
    body = llm_request(SPANS, seed=1).SerializeToString()
    headers = {"content-type": "application/x-protobuf"}
    os.sched_setaffinity(0, set(range(os.cpu_count() or 1)) - {0} or {0})
    env = dict(os.environ) if args.cold_allocator else {**os.environ, "GLIBC_TUNABLES": WARM_HEAP}
    heap = "cold" if args.cold_allocator else "warm"
    print(f"{len(body):,} bytes per request ({SPANS} spans); server pinned to CPU 0; {heap} heap")
    for _ in range(args.rounds):
        for kind in SERVERS:
            port = free_port()
            command = ["taskset", "-c", "0", sys.executable, __file__, "--serve", kind, str(port)]
            server = subprocess.Popen(command, env=env)
            try:
                wait_for_port(port, timeout=60)
                with httpx.Client(timeout=60) as client:
                    url = f"http://127.0.0.1:{port}/v1/traces"
                    for _ in range(10):  # warm up
                        client.post(url, content=body, headers=headers)
                    cpu_start, started, requests = _cpu_seconds(server.pid), time.monotonic(), 0
                    while time.monotonic() - started < args.seconds:
                        client.post(url, content=body, headers=headers).raise_for_status()
                        requests += 1
                    cpu = _cpu_seconds(server.pid) - cpu_start
            finally:
                server.kill()
                server.wait()
            print(
                f"  {kind:<10} {requests:5d} requests: server CPU {cpu / requests * 1e6:7,.0f} µs/request "
                f"= {cpu / requests / SPANS * 1e6:5.2f} µs/span"
            )


if __name__ == "__main__":
    main()
