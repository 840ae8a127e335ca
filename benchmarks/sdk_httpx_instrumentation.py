"""What ``opentelemetry-instrumentation-httpx`` costs per call, next to an uninstrumented call.

Why tinkertrace does not build its capture on it is in docs/sdk.md ("LLM call capture"); this
measures its cost. Plain httpx chat calls to the deterministic test server (a subprocess on loopback),
alternating batches without and with ``HTTPXClientInstrumentor`` (spans to a provider whose exporter
drops them), each call timed on its own (calling thread CPU, ``time.thread_time_ns``, and wall).
It is not a dependency of tinkertrace: ``pip install opentelemetry-instrumentation-httpx`` first.

    .venv/bin/python benchmarks/sdk_httpx_instrumentation.py [--calls 300] [--rounds 6]
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import httpx
import record
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from sdk_overhead import CHAT, EXTRAS, Samples, _start_server, measure  # same folder

from tinkertrace.netutil import free_port

MEASURES = ("src/tinkertrace/testing",)


class _Dropped(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=6)
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(__file__, MEASURES, args)
    try:
        from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    except ImportError:
        raise SystemExit("pip install opentelemetry-instrumentation-httpx to run this") from None

    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start")
    port = free_port()
    server = _start_server(port)
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Dropped()))
    instrumentor = HTTPXClientInstrumentor()
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    body = {**CHAT, **EXTRAS}
    try:
        client = httpx.Client()  # its HTTPTransport class is the one the instrumentation wraps

        def call() -> object:
            return client.post(url, json=body).json()

        measure(call, 50)
        plain, instrumented = Samples(), Samples()
        for _ in range(args.rounds):
            plain.add(measure(call, args.calls))
            instrumentor.instrument(tracer_provider=provider)
            instrumented.add(measure(call, args.calls))
            instrumentor.uninstrument()
        for what in ("cpu", "wall"):
            (pm, _), (im, _) = plain.stat(what), instrumented.stat(what)
            print(f"{what:>4} median per call: plain {pm:.0f} µs, instrumented {im:.0f} µs (+{im - pm:.0f})")
            result.add(f"plain_{what}_us", pm, "µs", f"median {what} time per plain httpx call")
            result.add(
                f"overhead_{what}_us", im - pm, "µs", f"added per call by HTTPXClientInstrumentor ({what})"
            )
        result.save()
        print(f"load average {os.getloadavg()[0]:.1f} at end")
    finally:
        provider.shutdown()
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
