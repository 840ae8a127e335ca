"""Tracing overhead of the SDK per LLM call and per rollout, against untraced calls.

Runs the deterministic OpenAI-compatible test server in a subprocess on loopback and drives it with
the real OpenAI client and plain httpx, alternating traced and untraced batches so both see the same
machine load. Traced calls run inside ``@traced_rollout`` with the embedded Parquet sink (the export
happens on the SDK's background thread). Prints, per call, the median wall time and the CPU time of
the calling thread (steadier on a busy machine), and the overhead of tracing in µs and %.

    .venv/bin/python benchmarks/sdk_overhead.py [--calls 300] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import httpx
import openai

import tinkertrace
from tinkertrace.netutil import free_port, wait_for_port

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "x" * 400}]


def _per_call_us(fn: Callable[[], object], calls: int) -> tuple[float, float]:
    """(wall µs, calling-thread CPU µs) per call."""
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - wall) / calls * 1e6, (time.thread_time() - cpu) / calls * 1e6


def _start_server(port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tinkertrace.testing.openai_server", "--port", str(port)]
    proc = subprocess.Popen([*cmd, "--reply", "y" * 100, "--chunk-chars", "10"])
    wait_for_port(port)
    return proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="calls per timed batch")
    parser.add_argument("--rounds", type=int, default=5, help="alternating traced/untraced batches")
    args = parser.parse_args()

    # a 100-byte reply (100 response token ids and logprobs per call), streamed in 10 chunks
    port = free_port()
    server_proc = _start_server(port)
    base_url = f"http://127.0.0.1:{port}/v1"
    spans = tempfile.mkdtemp(prefix="tt-bench-spans-")
    tinkertrace.init(spans_dir=spans)
    oa = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    hx = httpx.Client()
    chat_body = {"model": "m", "messages": MESSAGES}
    # untraced baselines ask for the same extras the SDK injects, so both get equal-sized answers
    extras = {"return_token_ids": True, "logprobs": True}

    cases: dict[str, tuple[Callable[[], object], Callable[[], object]]] = {
        "openai chat": (
            lambda: oa.chat.completions.create(model="m", messages=MESSAGES, extra_body=extras),
            lambda: oa.chat.completions.create(model="m", messages=MESSAGES),
        ),
        "openai chat stream": (
            lambda: list(
                oa.chat.completions.create(model="m", messages=MESSAGES, stream=True, extra_body=extras)
            ),
            lambda: list(oa.chat.completions.create(model="m", messages=MESSAGES, stream=True)),
        ),
        "httpx chat": (
            lambda: hx.post(base_url + "/chat/completions", json={**chat_body, **extras}).json(),
            lambda: hx.post(base_url + "/chat/completions", json=chat_body).json(),
        ),
    }

    @tinkertrace.traced_rollout
    def traced_batch(task: str, fn: Callable[[], object], calls: int) -> tuple[float, float]:
        return _per_call_us(fn, calls)

    head = f"{'case':<20}{'':>7}{'untraced µs':>13}{'traced µs':>11}{'overhead µs':>13}{'overhead %':>12}"
    print(head)
    for name, (untraced, traced) in cases.items():
        base, with_tracing = [], []
        _per_call_us(untraced, 20)  # warm up both paths
        traced_batch(name, traced, 20)
        for _ in range(args.rounds):
            base.append(_per_call_us(untraced, args.calls))
            with_tracing.append(traced_batch(name, traced, args.calls))
            tinkertrace.flush()  # keep the export thread's work out of the next batch
        for i, what in enumerate(("wall", "cpu")):
            b = statistics.median(x[i] for x in base)
            t = statistics.median(x[i] for x in with_tracing)
            print(f"{name:<20}{what:>7}{b:>13.0f}{t:>11.0f}{t - b:>13.0f}{(t - b) / b * 100:>11.1f}%")

    # the capture pipeline alone (no network): request parse + span + response parse + packing
    from tinkertrace.sdk import capture

    answer = hx.post(base_url + "/chat/completions", json={**chat_body, **extras})

    class Recorded:
        status_code, headers = 200, answer.headers

    def build() -> httpx.Request:
        return httpx.Request("POST", base_url + "/chat/completions", json=chat_body)

    def lifecycle() -> None:
        call = capture.begin(httpx, build())
        assert call is not None
        call.on_response(Recorded)
        call.feed(answer.content)
        call.finish()

    @tinkertrace.traced_rollout
    def pipeline(task: str) -> tuple[float, float]:
        n = args.calls * 5
        full = min(_per_call_us(lifecycle, n)[1] for _ in range(args.rounds))
        only_build = min(_per_call_us(build, n)[1] for _ in range(args.rounds))
        return full, only_build

    full, only_build = pipeline("pipeline")
    print(
        f"capture pipeline alone, CPU: {full - only_build:.0f} µs per call ({len(answer.content)} B response)"
    )

    # per rollout: an empty traced rollout (root span + final reward span) against a plain call
    @tinkertrace.traced_rollout
    def empty_rollout(task: dict) -> float:
        return 1.0

    def plain(task: dict) -> float:
        return 1.0

    task = {"id": "t1", "question": "q" * 200}
    n = args.calls * 10
    rollout_us = statistics.median(
        _per_call_us(lambda: empty_rollout(task), n)[1] for _ in range(args.rounds)
    )
    plain_us = statistics.median(_per_call_us(lambda: plain(task), n)[1] for _ in range(args.rounds))
    print(f"per rollout (root span + final reward span, no LLM call), CPU: {rollout_us - plain_us:.0f} µs")
    assert tinkertrace.flush()
    print("stats:", tinkertrace.stats())
    tinkertrace.shutdown()
    server_proc.terminate()
    server_proc.wait()


if __name__ == "__main__":
    main()
