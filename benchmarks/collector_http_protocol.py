"""The collector's HTTP server with its fenced protocol subclass (deadlines, the cap at connect) and on
uvicorn's public options only, in interleaved pairs; prints requests/s and the HTTP layer's CPU per
request.

Both run :class:`~tinkertrace.collector.http_server.HttpServer` in this process with a handler that
answers at once (no conversion, no disk), so the figures are the HTTP layer's own; client threads post
``--body-kb`` bodies over keep-alive connections as fast as they are answered.

    .venv/bin/python benchmarks/collector_http_protocol.py --pairs 3 --seconds 5 --clients 4
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import httpx
import record

from tinkertrace.collector.http_server import HttpServer, Request, Response
from tinkertrace.netutil import free_port

MEASURES = ("collector",)


class Answer:
    """Admits everything, answers 200 with the body's length."""

    def admit(self, request: Request) -> Response | None:
        return None

    def abandon(self, request: Request) -> None:
        pass

    def body_too_large(self, request: Request) -> Response:
        return Response(413)

    async def respond(self, request: Request) -> Response:
        return Response(200, b"%d" % len(request.body))


def run(limited: bool, seconds: float, clients: int, body: bytes) -> tuple[float, float]:
    """(requests/s, CPU ms per request of this whole process) for one server."""
    http = HttpServer(Answer(), "127.0.0.1", free_port(), max_body_bytes=64 << 20, limited_protocol=limited)
    http.start()
    url = f"http://127.0.0.1:{http.port}/v1/traces"
    counts = [0] * clients
    stop = time.monotonic() + seconds

    def post(i: int) -> None:
        with httpx.Client() as client:
            while time.monotonic() < stop:
                client.post(url, content=body).raise_for_status()
                counts[i] += 1

    cpu, started = time.process_time(), time.monotonic()
    threads = [threading.Thread(target=post, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall, cpu = time.monotonic() - started, time.process_time() - cpu
    http.stop()
    total = sum(counts)
    return total / wall, 1000 * cpu / max(total, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--body-kb", type=int, default=16)
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(__file__, MEASURES, args)
    body = bytes(range(256)) * (args.body_kb * 4)
    results: dict[str, list[tuple[float, float]]] = {"subclass (deadlines)": [], "public options": []}
    for pair in range(args.pairs):
        for name, limited in (("subclass (deadlines)", True), ("public options", False)):
            rate, cpu_ms = run(limited, args.seconds, args.clients, body)
            results[name].append((rate, cpu_ms))
            print(f"pair {pair + 1}  {name:22s} {rate:8.0f} req/s  {cpu_ms:6.3f} CPU ms/request", flush=True)
    print()
    for name, rows in results.items():
        rates, cpus = [r for r, _ in rows], [c for _, c in rows]
        rate, cpu_ms = statistics.median(rates), statistics.median(cpus)
        print(f"{name:22s} median {rate:8.0f} req/s  {cpu_ms:6.3f} CPU ms/request")
        key = "subclass" if "subclass" in name else "public"
        what = f"{name}, median of {args.pairs} pairs, {args.clients} clients"
        result.add(f"{key}_req_per_s", rate, "req/s", what)
        result.add(f"{key}_cpu_ms", cpu_ms, "CPU ms/request", what)
    result.save()


if __name__ == "__main__":
    main()
