"""Tracing overhead of the SDK per LLM call and per rollout, against untraced calls.

Runs the deterministic OpenAI-compatible test server in a subprocess on loopback (a 100-token reply
with logprobs and token ids, ~330 prompt tokens) and drives it with the real OpenAI client and plain
httpx, alternating untraced and traced batches so both see the same machine load. Traced calls run
inside ``@traced_rollout`` with the embedded Parquet sink; the untraced baseline asks for the same
extra fields the SDK adds, so both get equal-sized answers. Every call is timed on its own: wall time
and CPU time of the calling thread (``time.thread_time_ns``, steadier on a shared machine); the table
gives medians and p90 and the overhead of tracing (difference of medians) in µs and %.

Then, with no network: the capture pipeline on recorded responses (JSON and SSE), split into the
part on the agent's thread and the part done later on the export thread; a bare OTel span for
reference; and an empty rollout.

    .venv/bin/python benchmarks/sdk_overhead.py [--calls 200] [--rounds 5] [--pipeline 3000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import record

import tinkertrace
from tinkertrace.netutil import free_port, wait_for_port

MEASURES = ("src/tinkertrace/sdk", "src/tinkertrace/spanstore")

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Solve: " + "x" * 300},
]
REPLY = "y" * 100  # 100 byte tokens, each with a logprob
EXTRAS = {"return_token_ids": True, "logprobs": True}
RESPONSES_EXTRAS = {"return_token_ids": True, "include": ["message.output_text.logprobs"]}
CHAT = {"model": "m", "messages": MESSAGES}
RESPONSES = {"model": "m", "instructions": MESSAGES[0]["content"], "input": MESSAGES[1]["content"]}


@dataclass
class Samples:
    """Per-call wall and calling-thread CPU times, in ns."""

    wall: list[int] = field(default_factory=list)
    cpu: list[int] = field(default_factory=list)

    def add(self, other: Samples) -> None:
        self.wall += other.wall
        self.cpu += other.cpu

    def stat(self, what: str) -> tuple[float, float]:
        """(median µs, p90 µs) of ``wall`` or ``cpu``."""
        values = sorted(getattr(self, what))
        return statistics.median(values) / 1e3, values[int(len(values) * 0.9)] / 1e3


def measure(fn: Callable[[], object], calls: int) -> Samples:
    out = Samples()
    perf, cpu = time.perf_counter_ns, time.thread_time_ns
    for _ in range(calls):
        w0, c0 = perf(), cpu()
        fn()
        c1, w1 = cpu(), perf()
        out.wall.append(w1 - w0)
        out.cpu.append(c1 - c0)
    return out


def _start_server(port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tinkertrace.testing.openai_server", "--port", str(port)]
    proc = subprocess.Popen([*cmd, "--reply", REPLY, "--chunk-chars", "10"])
    wait_for_port(port)
    return proc


def _row(result: record.Result, name: str, base: Samples, traced: Samples) -> None:
    for what in ("wall", "cpu"):
        (bm, b90), (tm, t90) = base.stat(what), traced.stat(what)
        print(
            f"{name:<20}{what:>5}{bm:>10.0f}{b90:>8.0f}{tm:>10.0f}{t90:>8.0f}"
            f"{tm - bm:>10.0f}{(tm - bm) / bm * 100:>8.1f}%"
        )
        what_it_is = f"{name}: tracing overhead per call ({what} time, difference of medians)"
        result.add(f"{record.slug(name)}_{what}_overhead_us", tm - bm, "µs", what_it_is)


def network_cases(result: record.Result, base_url: str, calls: int, rounds: int) -> None:
    """Untraced vs traced calls through the OpenAI client and httpx, sync, JSON and SSE."""
    oa = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    hx = httpx.Client()
    cases: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        "openai chat": (
            lambda: oa.chat.completions.create(model="m", messages=MESSAGES, extra_body=EXTRAS),
            lambda: oa.chat.completions.create(model="m", messages=MESSAGES),
        ),
        "openai chat stream": (
            lambda: list(
                oa.chat.completions.create(model="m", messages=MESSAGES, stream=True, extra_body=EXTRAS)
            ),
            lambda: list(oa.chat.completions.create(model="m", messages=MESSAGES, stream=True)),
        ),
        "openai responses": (
            lambda: oa.responses.create(**RESPONSES, extra_body=RESPONSES_EXTRAS),
            lambda: oa.responses.create(**RESPONSES),
        ),
        "openai resp. stream": (
            lambda: list(oa.responses.create(**RESPONSES, stream=True, extra_body=RESPONSES_EXTRAS)),
            lambda: list(oa.responses.create(**RESPONSES, stream=True)),
        ),
        "httpx chat": (
            lambda: hx.post(base_url + "/chat/completions", json={**CHAT, **EXTRAS}).json(),
            lambda: hx.post(base_url + "/chat/completions", json=CHAT).json(),
        ),
    }

    @tinkertrace.traced_rollout
    def traced_batch(task: str, fn: Callable[[], object], n: int) -> Samples:
        return measure(fn, n)

    print(f"\nper LLM call, {rounds} rounds x {calls} calls each way (µs; overhead = difference of medians)")
    print(f"{'case':<20}{'':>5}{'base med':>10}{'p90':>8}{'traced':>10}{'p90':>8}{'overhead':>10}{'%':>9}")
    for name, (untraced, traced) in cases.items():
        measure(untraced, 30)  # warm up both paths
        traced_batch(name, traced, 30)
        tinkertrace.flush()
        base, with_tracing = Samples(), Samples()
        for _ in range(rounds):
            base.add(measure(untraced, calls))
            with_tracing.add(traced_batch(name, traced, calls))
            tinkertrace.flush()  # keep the export thread's work out of the next batch
        _row(result, name, base, with_tracing)


def _recorded(hx: httpx.Client, url: str, body: dict[str, Any]) -> tuple[httpx.Headers, list[bytes]]:
    with hx.stream("POST", url, json=body) as response:
        return response.headers, list(response.iter_raw())


class _Recorded:
    """A response as the patched send sees it: status, headers, a body stream."""

    def __init__(self, headers: httpx.Headers) -> None:
        self.status_code, self.headers, self.stream = 200, headers, None


def _pipeline_case(
    url: str, body: dict[str, Any], headers: httpx.Headers, chunks: list[bytes], n: int
) -> tuple[float, ...]:
    """(agent-thread median, p90, export-thread median, p90) CPU µs of one recorded response."""
    from tinkertrace.sdk import capture

    tee = capture._tee_types(httpx)[0]
    ended: list[Any] = []

    def build() -> httpx.Request:
        return httpx.Request("POST", url, json=body)

    def agent_side() -> None:
        call, _ = capture.begin(httpx, build())
        assert call is not None
        call.attach(_Recorded(headers), tee)
        for chunk in chunks:
            call.feed(chunk)
        call.finish()
        ended.append(call)

    @tinkertrace.traced_rollout
    def run(task: str) -> tuple[Samples, Samples, Samples]:
        measure(agent_side, 200)
        only_build = measure(build, n)
        ended.clear()
        agent = measure(agent_side, n)
        calls = iter(list(ended))
        export = measure(lambda: next(calls).span_content(), n)
        return only_build, agent, export

    only_build, agent, export = run("pipeline")
    tinkertrace.flush()
    (bm, b90), (am, a90) = only_build.stat("cpu"), agent.stat("cpu")
    return (am - bm, a90 - b90, *export.stat("cpu"))


def pipeline(result: record.Result, base_url: str, n: int) -> None:
    """The capture pipeline on recorded responses, agent thread and export thread apart."""
    hx = httpx.Client()
    print(f"\ncapture pipeline on recorded responses, {n} calls (CPU µs, median / p90)")
    apis = (
        ("chat", "/chat/completions", CHAT, EXTRAS),
        ("responses", "/responses", RESPONSES, RESPONSES_EXTRAS),
    )
    for api, path, body, extras in apis:
        for label, stream in (("JSON", False), ("SSE", True)):
            headers, chunks = _recorded(hx, base_url + path, {**body, "stream": stream, **extras})
            size = sum(len(c) for c in chunks)
            am, a90, em, e90 = _pipeline_case(base_url + path, {**body, "stream": stream}, headers, chunks, n)
            print(
                f"  {api:<9} {label:<4} {size:>6} B in {len(chunks):>2} chunk(s): agent thread"
                f" {am:4.0f} / {a90:4.0f}; export thread (span build: parse, pack, messages)"
                f" {em:4.0f} / {e90:4.0f}"
            )
            key, what = f"{api}_{label.lower()}", f"capture of a recorded {api} {label} response"
            result.add(f"{key}_agent_cpu_us", am, "CPU µs", f"{what}: on the agent's thread, median")
            result.add(f"{key}_export_cpu_us", em, "CPU µs", f"{what}: on the export thread, median")


def rollout_and_span(result: record.Result, n: int) -> None:
    """An empty rollout against a plain call, and a bare span of the SDK's tracer."""
    from tinkertrace.sdk import runtime

    @tinkertrace.traced_rollout
    def empty_rollout(task: dict) -> float:
        return 1.0

    def plain(task: dict) -> float:
        return 1.0

    task = {"id": "t1", "question": "q" * 200}
    tracer = runtime.get().tracer
    for fn in (lambda: empty_rollout(task), lambda: plain(task), lambda: tracer.start_span("x").end()):
        measure(fn, 200)
    rollout = measure(lambda: empty_rollout(task), n).stat("cpu")
    base = measure(lambda: plain(task), n).stat("cpu")
    span = measure(lambda: tracer.start_span("x").end(), n).stat("cpu")
    tinkertrace.flush()
    print(f"\nbare OTel span start+end (reference), CPU: {span[0]:.0f} µs median, {span[1]:.0f} p90")
    print(
        "per rollout (root span + final reward span, no LLM call), CPU:"
        f" {rollout[0] - base[0]:.0f} µs median, {rollout[1] - base[1]:.0f} p90"
    )
    result.add("rollout_cpu_us", rollout[0] - base[0], "CPU µs", "per rollout without LLM calls, median")
    result.add("bare_span_cpu_us", span[0], "CPU µs", "a bare OTel span start+end (reference), median")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="calls per timed batch")
    parser.add_argument("--rounds", type=int, default=5, help="alternating untraced/traced batches")
    parser.add_argument("--pipeline", type=int, default=3000, help="calls in the no-network benchmarks")
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(__file__, MEASURES, args)

    load = os.getloadavg()[0]
    print(f"machine: {os.cpu_count()} cores, load average {load:.1f} at start")
    port = free_port()
    server = _start_server(port)
    base_url = f"http://127.0.0.1:{port}/v1"
    tinkertrace.init(spans_dir=tempfile.mkdtemp(prefix="tt-bench-spans-"))
    try:
        network_cases(result, base_url, args.calls, args.rounds)
        pipeline(result, base_url, args.pipeline)
        rollout_and_span(result, args.pipeline)
        assert tinkertrace.flush()
        print("\nstats:", tinkertrace.stats())
        print(f"load average {os.getloadavg()[0]:.1f} at end")
        result.save()
    finally:
        tinkertrace.shutdown()
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
