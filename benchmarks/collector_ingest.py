"""Sustained OTLP/HTTP protobuf ingest into a collector process; prints spans/s, MB/s and peak RSS.

The collector runs as its own process (``python -m tinkertrace.cli.main collector``); client processes post
pre-encoded requests of realistic LLM spans (packed token ids and logprobs; each span's token counts,
and so its usage attributes, vary by ``--spread``; ``--bodies`` distinct requests per client, so no
Parquet file holds a span twice) as fast as they are acknowledged. The rates are measured after
``--warmup`` seconds, as a long-running collector sees them: in its first seconds of traffic the
collector's heap grows to its working size (~70,000 page faults measured on the 2-core dev VM),
which an 8-second run would charge to the spans. "end-to-end" counts every span sent until it is in
Parquet (SIGTERM flush included).
Besides wall-clock rates it reads the collector's CPU seconds (user + system, all its threads) from
``/proc/<pid>/stat``, so "spans per collector CPU-second" (= spans/s on one fully used core) stays
meaningful on a shared machine where the collector does not get a whole core.
The overload run gives the collector a small queue and more clients than it can serve, and shows
429 answers with memory staying bounded.

    .venv/bin/python benchmarks/collector_ingest.py --seconds 20 --clients 2
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import httpx
import record

from tinkertrace.collector.launch import collector_command, wait_until_healthy
from tinkertrace.netutil import free_port
from tinkertrace.spanstore.reader import open_spans
from tinkertrace.spanstore.samples import llm_request

MEASURES = ("collector", "src/tinkertrace/spanstore", "schemas")


def _client(
    url: str,
    seconds: float,
    spans: int,
    prompt: int,
    response: int,
    spread: float,
    packed: bool,
    n_bodies: int,
    seed: int,
    ready: mp.Queue,
    go: Any,
    acked: Any,
    out: mp.Queue,
) -> None:
    bodies = [
        llm_request(
            spans,
            prompt_tokens=prompt,
            response_tokens=response,
            spread=spread,
            packed=packed,
            seed=seed * 10_000 + i,
        ).SerializeToString()
        for i in range(n_bodies)
    ]
    ready.put(seed)
    go.wait()
    ok = refused = sent_bytes = 0
    headers = {"content-type": "application/x-protobuf"}
    with httpx.Client(timeout=60) as client:
        deadline = time.monotonic() + seconds
        i = 0
        while time.monotonic() < deadline:
            body = bodies[i % len(bodies)]
            i += 1
            status = client.post(url, content=body, headers=headers).status_code
            if status == 200:
                ok += spans
                sent_bytes += len(body)
                acked[seed] = ok  # read by the parent at the end of the warm-up
            elif status in (429, 503):
                refused += 1
                time.sleep(0.05)
            else:
                raise RuntimeError(f"unexpected HTTP {status}")
    out.put((ok, refused, sent_bytes))


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (all threads), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds per thread name (the collector names its threads tt-http, tt-wal, tt-parquet)."""
    totals: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        seconds = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        key = name if name.startswith("tt-") else "other"
        totals[key] = totals.get(key, 0.0) + seconds
    return totals


def run(
    label: str,
    args: argparse.Namespace,
    result: record.Result,
    clients: int,
    bodies: int,
    extra: list[str],
) -> tuple[float, float]:
    """One run; returns (acknowledged spans/s, spans per collector CPU-second) of its measured window."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "spans"
        port = free_port()
        command = collector_command(out, port, "--no-grpc", "--zstd-level", str(args.zstd_level), *extra)
        if args.collector_cpu is not None:  # pin the collector (all its threads) to one core
            command = ["taskset", "-c", str(args.collector_cpu), *command]
        collector = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        wait_until_healthy(collector, port, timeout=60)
        url = f"http://127.0.0.1:{port}/v1/traces"
        queue: mp.Queue = mp.Queue()
        ready: mp.Queue = mp.Queue()
        go = mp.Event()
        acked = mp.Array("q", clients, lock=False)  # spans acknowledged so far, per client
        shape = (args.spans, args.prompt, args.response, args.spread, not args.arrays, bodies)
        seconds = args.warmup + args.seconds
        procs = [
            mp.Process(target=_client, args=(url, seconds, *shape, c, ready, go, acked, queue))
            for c in range(clients)
        ]
        for proc in procs:
            proc.start()
        for _ in procs:  # the clients encode their requests (on every core) before the clock starts
            ready.get()
        for proc in procs:
            if args.collector_cpu is not None and proc.pid is not None:  # clients keep off its core
                others = os.sched_getaffinity(0) - {args.collector_cpu}
                os.sched_setaffinity(proc.pid, others or {args.collector_cpu})
        cpu_before = _cpu_seconds(collector.pid)
        started = time.perf_counter()
        go.set()
        time.sleep(args.warmup)
        warm_spans = sum(acked)  # the measured window starts here
        cpu_start = _cpu_seconds(collector.pid)
        threads_start = _thread_cpu_seconds(collector.pid)
        measured_from = time.perf_counter()
        results = [queue.get() for _ in procs]
        acked_at = time.perf_counter()
        cpu_acked = _cpu_seconds(collector.pid) - cpu_start
        threads = _thread_cpu_seconds(collector.pid)
        for proc in procs:
            proc.join()
        rss = _peak_rss_mb(collector.pid)
        collector.send_signal(signal.SIGTERM)
        _, _, usage = os.wait4(collector.pid, 0)
        flushed_at = time.perf_counter()
        cpu_total = usage.ru_utime + usage.ru_stime - cpu_before
        collector.communicate(timeout=60)
        sent = sum(r[0] for r in results)
        spans = sent - warm_spans  # in the measured window
        refused = sum(r[1] for r in results)
        mbytes = sum(r[2] for r in results) / 1e6 * spans / max(sent, 1)
        window = acked_at - measured_from
        con = duckdb.connect()
        open_spans(con, out)
        stored = con.execute("SELECT count(*) FROM spans").fetchone()[0]
        parquet_mb = sum(p.stat().st_size for p in out.rglob("*.parquet")) / 1e6
        print(
            f"== {label}: {clients} client process(es), {args.spans} spans/request, "
            f"{args.prompt}+{args.response} token ids per span (±{args.spread:.0%}, "
            f"{'plain arrays' if args.arrays else 'packed'}), "
            f"{bodies} distinct requests per client"
        )
        print(
            f"  acknowledged after {args.warmup:g}s of warm-up: {spans:,} spans in {window:.1f}s = "
            f"{spans / window:,.0f} spans/s, {mbytes / window:.1f} MB/s of OTLP"
        )
        print(
            f"  end-to-end (all {sent:,} spans, warm-up and final flush included): "
            f"{sent / (flushed_at - started):,.0f} spans/s; "
            f"stored {stored:,} spans in {parquet_mb:.1f} MB of Parquet"
        )
        print(
            f"  collector CPU: {cpu_acked:.1f}s while acknowledging = {spans / max(cpu_acked, 1e-9):,.0f} "
            f"spans per CPU-second ({cpu_acked / max(spans, 1) * 1e6:.1f} µs/span); whole run incl. final "
            f"flush {cpu_total:.1f}s = {sent / max(cpu_total, 1e-9):,.0f} spans per CPU-second"
        )
        per_thread = {name: cpu - threads_start.get(name, 0.0) for name, cpu in threads.items()}
        print(
            "  collector CPU µs/span by thread while acknowledging: "
            + ", ".join(f"{name} {cpu / max(spans, 1) * 1e6:.1f}" for name, cpu in sorted(per_thread.items()))
            + " (tt-http: HTTP + protobuf→Arrow conversion; tt-wal: WAL + fsync; tt-parquet: sort + write)"
        )
        print(f"  refused (429/503): {refused} requests; collector peak RSS {rss:.0f} MB")
        if stored != sent:
            raise SystemExit(f"stored {stored} spans but {sent} were acknowledged")
        key = "overload_" if extra else ""
        what = f"{label}, {clients} clients"
        result.add(f"{key}spans_per_s", spans / window, "spans/s", f"{what}: acknowledged after the warm-up")
        result.add(
            f"{key}spans_per_cpu_s",
            spans / max(cpu_acked, 1e-9),
            "spans/CPU-s",
            f"{what}: per collector CPU-second",
        )
        result.add(f"{key}refused", refused, "requests", f"{what}: answered 429/503")
        result.add(f"{key}peak_rss_mb", rss, "MB", f"{what}: collector peak RSS")
        return spans / window, spans / max(cpu_acked, 1e-9)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--seconds", type=float, default=15, help="how long each client sends after the warm-up"
    )
    parser.add_argument(
        "--warmup",
        type=float,
        default=3,
        help="seconds of sending before the measured window starts (the collector's heap grows to "
        "its working size)",
    )
    parser.add_argument("--clients", type=int, default=2, help="client processes in the sustained run")
    parser.add_argument("--spans", type=int, default=512, help="spans per request (the OTel SDK batch size)")
    parser.add_argument("--prompt", type=int, default=300, help="prompt token ids per span")
    parser.add_argument(
        "--response", type=int, default=100, help="response token ids (and logprobs) per span"
    )
    parser.add_argument(
        "--spread", type=float, default=0.5, help="each span's token counts vary by up to this fraction"
    )
    parser.add_argument(
        "--bodies",
        type=int,
        default=128,
        help="distinct requests each client encodes and cycles through; more than a Parquet file holds "
        "(~90 of 512 spans), so files hold no repeated spans, which zstd would compress for free",
    )
    parser.add_argument(
        "--zstd-level", type=int, default=1, help="the collector's --zstd-level (1 is its default)"
    )
    parser.add_argument(
        "--arrays",
        action="store_true",
        help="send token ids and logprobs as plain OTel int/double arrays (other producers' form) "
        "instead of packed bytes",
    )
    parser.add_argument("--no-overload", action="store_true", help="skip the overload run")
    parser.add_argument(
        "--collector-cpu",
        type=int,
        default=None,
        help="pin the collector to this CPU (taskset): its spans/s is then the rate on one core",
    )
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(__file__, MEASURES, args, variant="arrays" if args.arrays else "")
    run("sustained", args, result, args.clients, args.bodies, [])
    if not args.no_overload:  # memory under overload, not speed: fewer distinct requests to encode
        overload = ["--max-queue-mb", "16", "--max-file-mb", "32"]
        run("overload (queue 16 MiB)", args, result, args.clients * 3, min(args.bodies, 16), overload)
    result.save()


if __name__ == "__main__":
    main()
