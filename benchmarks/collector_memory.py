"""Peak RSS of a collector process under a flood of senders and under stalled bodies; prints figures.

Two phases against one collector (``--max-queue-mb`` is its memory budget):

1. flood: ``--senders`` threads (default 48) each post a ~2.3 MB OTLP protobuf request (820 LLM spans)
   over keep-alive connections as fast as they are answered, for ``--seconds``; answers of 429/503 are
   retried after 50 ms, as the OTel exporters do.
2. stalled bodies: ``--stalled`` connections (default 12) each declare a 60 MB body, send 50 MB of it
   and stop for ``--stall-seconds``, then close.

Peak RSS is the kernel's high-water mark (``VmHWM``), reset between phases through
``/proc/<pid>/clear_refs``; RSS is also read after each phase.

    .venv/bin/python benchmarks/collector_memory.py --max-queue-mb 8
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import record

from tinkertrace.collector.launch import collector_command, wait_until_healthy
from tinkertrace.netutil import free_port
from tinkertrace.spanstore.samples import llm_request

MEASURES = ("collector", "src/tinkertrace/spanstore")


def _status_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def _flood(port: int, body: bytes, senders: int, seconds: float) -> dict[int, int]:
    counts: dict[int, int] = {}
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def send() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        headers = {"content-type": "application/x-protobuf"}
        while time.monotonic() < deadline:
            try:
                connection.request("POST", "/v1/traces", body=body, headers=headers)
                response = connection.getresponse()
                response.read()
                status = response.status
            except OSError:  # closed by the server (e.g. after an early answer): reconnect
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
                status = -1
            with lock:
                counts[status] = counts.get(status, 0) + 1
            if status != 200:
                time.sleep(0.05)
        connection.close()

    threads = [threading.Thread(target=send) for _ in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return counts


def _stall(port: int, connections: int, declared: int, sent: int, seconds: float) -> dict[str, int]:
    """Open ``connections`` that each declare ``declared`` bytes, send ``sent`` of them and stall."""
    answers: dict[str, int] = {}
    sockets = []
    chunk = b"\x0a" * (1 << 20)
    for _ in range(connections):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(
            b"POST /v1/traces HTTP/1.1\r\nhost: x\r\ncontent-type: application/x-protobuf\r\n"
            b"content-length: %d\r\n\r\n" % declared
        )
        sockets.append(sock)

    def send_part(sock: socket.socket) -> None:
        try:
            for _ in range(sent // len(chunk)):
                sock.sendall(chunk)
        except OSError:
            pass

    threads = [threading.Thread(target=send_part, args=(s,)) for s in sockets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(seconds)
    for sock in sockets:
        sock.setblocking(False)
        try:
            head = sock.recv(200).split(b"\r\n", 1)[0].decode() or "closed"
        except BlockingIOError:
            head = "no answer yet"
        except OSError:
            head = "reset"
        answers[head] = answers.get(head, 0) + 1
        sock.close()
    return answers


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--max-queue-mb", type=float, default=8, help="the collector's memory budget")
    parser.add_argument("--senders", type=int, default=48)
    parser.add_argument("--seconds", type=float, default=10, help="length of the flood")
    parser.add_argument("--stalled", type=int, default=12)
    parser.add_argument("--stall-seconds", type=float, default=5)
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(__file__, MEASURES, args)
    body = llm_request(820, prompt_tokens=300, response_tokens=100, seed=1).SerializeToString()
    print(f"budget (--max-queue-mb) {args.max_queue_mb:g} MiB; each phase on a fresh collector")
    with _collector(args.max_queue_mb) as pid_port:
        pid, port = pid_port
        rest = _status_mb(pid, "VmRSS")
        _reset_peak(pid)
        counts = _flood(port, body, args.senders, args.seconds)
        print(
            f"flood: {args.senders} senders x {len(body) / 1e6:.1f} MB requests for {args.seconds:g}s: "
            f"answers {dict(sorted(counts.items()))}; RSS at rest {rest:.0f} MB, peak "
            f"{_status_mb(pid, 'VmHWM'):.0f} MB, after {_status_mb(pid, 'VmRSS'):.0f} MB"
        )
        flood = f"flood of {args.senders} senders, budget {args.max_queue_mb:g} MiB"
        result.add("flood_accepted", counts.get(200, 0), "requests", f"{flood}: answered 200")
        result.add("flood_refused", counts.get(429, 0), "requests", f"{flood}: answered 429")
        result.add(
            "flood_peak_above_rest_mb", _status_mb(pid, "VmHWM") - rest, "MB", f"{flood}: peak RSS above rest"
        )
    with _collector(args.max_queue_mb) as (pid, port):
        rest = _status_mb(pid, "VmRSS")
        _reset_peak(pid)
        answers = _stall(port, args.stalled, 60_000_000, 50_000_000, args.stall_seconds)
        peak = _status_mb(pid, "VmHWM")
        time.sleep(2)
        print(
            f"stalled: {args.stalled} connections each sending 50 of a declared 60 MB, then silent for "
            f"{args.stall_seconds:g}s: answers {answers}; RSS at rest {rest:.0f} MB, peak {peak:.0f} MB, "
            f"2 s after they closed {_status_mb(pid, 'VmRSS'):.0f} MB"
        )
        stalled = f"{args.stalled} stalled 60 MB bodies"
        result.add("stalled_peak_above_rest_mb", peak - rest, "MB", f"{stalled}: peak RSS above rest")
        result.add(
            "stalled_after_mb", _status_mb(pid, "VmRSS"), "MB", f"{stalled}: RSS 2 s after they closed"
        )
    result.save()


@contextlib.contextmanager
def _collector(max_queue_mb: float) -> Iterator[tuple[int, int]]:
    """A collector process on a free port: (pid, port)."""
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        command = collector_command(f"{tmp}/spans", port, "--no-grpc", "--max-queue-mb", str(max_queue_mb))
        collector = subprocess.Popen(command, stdout=subprocess.DEVNULL)
        try:
            wait_until_healthy(collector, port, timeout=120)
            yield collector.pid, port
        finally:
            collector.terminate()
            collector.wait(timeout=120)


if __name__ == "__main__":
    main()
