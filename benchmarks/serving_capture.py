"""What recording costs the endpoint, and what a collector restart under load loses.

``cost``: the endpoint over the local engine (built-in model, CPU) served twice in this process, one
app recording every call (:class:`~tinkertrace.serving.recording.CallRecorder` into a spans folder,
the SDK's export thread included) and one not; one OpenAI client calls them in interleaved pairs
(off, on, on, off, ...) with a 20-token completion, so load drifts hit both alike. Wall time per call,
and this process's CPU time per call (the recording side's flushed after each call, so the export
thread's work on its span is counted with it): on a loaded machine the CPU figure is the steadier.

``durable``: two ``tinkertrace serve`` processes on the built-in model, both recording to a spans
folder, one answering only once each call's spans are fsynced in its journal (``--durable``, the
default) and one answering first (``--no-durable``); for each ``--agents`` level, that many concurrent
agents (asyncio, calls under a rollout URL prefix, 8-token completions) load one of them for
``--round-s`` seconds at a time, alternating (off, on, on, off, ...). Latency per call (p50/p99),
calls per second, and how many spans each journal fsync carried. With one agent the difference is
what durability adds to a call; with many, the model is the bottleneck and agents queue for it
(closed loop: equal throughput means equal mean latency), so throughput is the figure to compare.

``restart``: the endpoint (scripted sampler: the recording path, not the model, is what is loaded)
records to a real collector subprocess; client threads call it for ``--seconds`` under rollout URL
prefixes; midway the collector is killed (SIGKILL, no flush) and restarted on the same port two
seconds later. After a flush, every answered call's response id is looked up in the Parquet files.

    .venv/bin/python benchmarks/serving_capture.py cost --pairs 100
    .venv/bin/python benchmarks/serving_capture.py durable --agents 1 64 --rounds 8 --round-s 5
    .venv/bin/python benchmarks/serving_capture.py restart --seconds 20 --clients 4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import duckdb
import openai
import record

from tinkertrace.collector.launch import collector_command, wait_until_healthy
from tinkertrace.models.tokenizer import BUILTIN_MODEL, load_tokenizer
from tinkertrace.netutil import BackgroundServer, free_port, wait_for_port
from tinkertrace.serving.app import create_app
from tinkertrace.serving.policy import PolicyHolder
from tinkertrace.serving.recording import CallRecorder
from tinkertrace.spanstore.reader import open_spans

MEASURES = ("src/tinkertrace/serving", "src/tinkertrace/sdk", "collector", "src/tinkertrace/spanstore")


def _call(client: openai.OpenAI, model: str, max_tokens: int) -> tuple[float, int]:
    started = time.perf_counter()
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Who are you?"}], max_tokens=max_tokens
    )
    return time.perf_counter() - started, reply.usage.completion_tokens if reply.usage else 0


def cost(result: record.Result, pairs: int, max_tokens: int, warmup: int) -> None:
    from tinkertrace.engine import ServiceClient

    with tempfile.TemporaryDirectory() as tmp:
        service = ServiceClient(base_dir=Path(tmp) / "engine")
        sampler, tokenizer = (
            service.create_sampling_client(base_model=BUILTIN_MODEL),
            load_tokenizer(BUILTIN_MODEL),
        )
        recorder = CallRecorder(spans_dir=Path(tmp) / "spans")
        apps = {
            "off": create_app(PolicyHolder(sampler, tokenizer, BUILTIN_MODEL), batch_window_s=0),
            "on": create_app(
                PolicyHolder(sampler, tokenizer, BUILTIN_MODEL), batch_window_s=0, recorder=recorder
            ),
        }
        servers = {name: BackgroundServer(app).start() for name, app in apps.items()}
        clients = {
            n: openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0) for n, s in servers.items()
        }
        times: dict[str, list[float]] = {"off": [], "on": []}
        cpu: dict[str, list[float]] = {"off": [], "on": []}
        tokens: dict[str, list[int]] = {"off": [], "on": []}
        for i in range(warmup + pairs):
            for name in ("off", "on") if i % 2 == 0 else ("on", "off"):
                cpu_start = time.process_time()
                seconds, n = _call(clients[name], BUILTIN_MODEL, max_tokens)
                if name == "on":  # the delivery of this call's span (Parquet) counts for this call
                    _delivered(recorder, i + 1)
                if i >= warmup:
                    cpu[name].append(time.process_time() - cpu_start)
                    times[name].append(seconds)
                    tokens[name].append(n)
        recorder.flush(30)
        recorded = recorder.stats()
        for server in servers.values():
            server.stop()
    print(f"load: {os.getloadavg()[0]:.2f} (1-min average), {os.cpu_count()} CPUs")
    for name in ("off", "on"):
        t = times[name]
        print(
            f"capture {name:3s}: median {statistics.median(t) * 1000:7.2f} ms, "
            f"mean {statistics.fmean(t) * 1000:7.2f} ms per call (wall); "
            f"CPU of this process {statistics.fmean(cpu[name]) * 1000:7.2f} ms per call, "
            f"mean completion {statistics.fmean(tokens[name]):.1f} tokens ({len(t)} calls)"
        )
    med = statistics.median(times["on"]) / statistics.median(times["off"]) - 1
    mean = statistics.fmean(times["on"]) / statistics.fmean(times["off"]) - 1
    cpu_cost = statistics.fmean(cpu["on"]) / statistics.fmean(cpu["off"]) - 1
    print(
        f"recording costs {med * 100:+.1f} % wall (medians), {mean * 100:+.1f} % wall (means), "
        f"{cpu_cost * 100:+.1f} % CPU (means, span building and export included); {recorded}"
    )
    for name in ("off", "on"):
        what = f"capture {name}: median wall time per call ({len(times[name])} calls)"
        result.add(f"capture_{name}_ms", statistics.median(times[name]) * 1000, "ms", what)
    result.add("wall_cost_pct", med * 100, "%", "recording's cost in wall time (medians)")
    result.add("cpu_cost_pct", cpu_cost * 100, "%", "recording's cost in this process's CPU (means)")


def _delivered(recorder: CallRecorder, spans: int) -> None:
    """Wait until the journal delivered ``spans`` spans (without ending its segment)."""
    while recorder.stats()["spans_delivered"] < spans:
        time.sleep(0.0005)


async def _agents_round(url: str, agents: int, seconds: float, tag: str) -> tuple[list[float], int]:
    """``agents`` agents calling ``url`` for ``seconds``: each call's latency, and the errors."""
    import httpx

    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds
    body = {
        "model": BUILTIN_MODEL,
        "messages": [{"role": "user", "content": "Who are you?"}],
        "max_tokens": 8,
    }

    async def agent(n: int, client: httpx.AsyncClient) -> None:
        nonlocal errors
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            try:
                reply = await client.post(f"{url}/rollouts/{tag}-{n}/v1/chat/completions", json=body)
            except httpx.HTTPError as exc:
                print(f"{url}: {exc!r}")
                errors += 1
                continue
            if reply.status_code == 200:
                latencies.append(time.perf_counter() - started)
            else:
                errors += 1
        await client.post(f"{url}/v1/rollouts/{tag}-{n}/finish")

    limits = httpx.Limits(max_connections=agents + 1)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        await asyncio.gather(*(agent(n, client) for n in range(agents)))
    return latencies, errors


def _durable_servers(tmp: Path) -> tuple[dict[str, subprocess.Popen[bytes]], dict[str, str]]:
    """Two recording `serve` processes, answering after the fsync (``on``) or before it (``off``)."""
    import sys

    procs, urls = {}, {}
    for name, flag in (("off", "--no-durable"), ("on", "--durable")):
        port = free_port()
        cmd = [sys.executable, "-m", "tinkertrace.cli.main", "serve", "--port", str(port), flag]
        cmd += ["--spans-dir", str(tmp / name), "--engine-dir", str(tmp / "engine")]
        with open(tmp / f"{name}.log", "wb") as log:
            procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        urls[name] = f"http://127.0.0.1:{port}"
    for name, url in urls.items():
        wait_for_port(int(url.rsplit(":", 1)[1]), timeout=180)
        asyncio.run(_agents_round(url, 4, 1.0, f"warm-{name}"))
    return procs, urls


def durable(result: record.Result, levels: list[int], rounds: int, round_s: float) -> None:
    import httpx

    print(f"load: {os.getloadavg()[0]:.2f} (1-min average), {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        procs, urls = _durable_servers(Path(tmp))
        for proc in procs.values():
            stack.callback(proc.wait, 60)
            stack.callback(proc.terminate)
        for agents in levels:
            before = {name: httpx.get(f"{url}/health").json()["recording"] for name, url in urls.items()}
            latencies: dict[str, list[float]] = {"off": [], "on": []}
            rates: dict[str, list[float]] = {"off": [], "on": []}
            errors = {"off": 0, "on": 0}
            for r in range(rounds):
                for name in ("off", "on") if r % 2 == 0 else ("on", "off"):
                    lat, err = asyncio.run(_agents_round(urls[name], agents, round_s, f"a{agents}r{r}"))
                    latencies[name] += lat
                    rates[name].append(len(lat) / round_s)
                    errors[name] += err
            after = {name: httpx.get(f"{url}/health").json()["recording"] for name, url in urls.items()}
            p50, p99 = {}, {}
            for name in ("off", "on"):
                p50[name] = statistics.median(latencies[name])
                p99[name] = statistics.quantiles(latencies[name], n=100)[98]
                spans = after[name]["spans_logged"] - before[name]["spans_logged"]
                commits = after[name]["journal_commits"] - before[name]["journal_commits"]
                waited = after[name]  # the last 10,000 records' wait for their fsync, queued to durable
                print(
                    f"{agents:3d} agents, durable {name:3s}: p50 {p50[name] * 1000:7.1f} ms, p99 "
                    f"{p99[name] * 1000:7.1f} ms, {statistics.fmean(rates[name]):6.1f} calls/s "
                    f"({len(latencies[name])} calls, {errors[name]} errors); {spans / max(1, commits):.1f} "
                    f"spans per fsync, journal wait p50 {waited.get('durable_wait_ms_p50')} ms, "
                    f"p99 {waited.get('durable_wait_ms_p99')} ms"
                )
            print(
                f"{agents:3d} agents: durability adds {(p50['on'] - p50['off']) * 1000:+.1f} ms at p50, "
                f"{(p99['on'] - p99['off']) * 1000:+.1f} ms at p99; throughput "
                f"{(statistics.fmean(rates['on']) / statistics.fmean(rates['off']) - 1) * 100:+.1f} %"
            )
            for name in ("off", "on"):
                what = f"{agents} agent(s), durable {name}"
                result.add(
                    f"agents_{agents}_durable_{name}_p50_ms", p50[name] * 1000, "ms", f"{what}: p50 latency"
                )
                result.add(
                    f"agents_{agents}_durable_{name}_p99_ms", p99[name] * 1000, "ms", f"{what}: p99 latency"
                )
                result.add(
                    f"agents_{agents}_durable_{name}_calls_s", statistics.fmean(rates[name]), "calls/s", what
                )
    print(f"load: {os.getloadavg()[0]:.2f} (1-min average) at the end")


def restart(result: record.Result, seconds: float, clients: int) -> None:
    from tinkertrace.testing.scripted_sampler import ScriptedTinkerSampler

    with tempfile.TemporaryDirectory() as tmp:
        out, port = Path(tmp) / "spans", free_port()
        command = collector_command(out, port, "--no-grpc", "--roll-seconds", "0.5")

        def start_collector() -> subprocess.Popen[bytes]:
            proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            wait_until_healthy(proc, port, timeout=60)
            return proc

        collector = start_collector()
        recorder = CallRecorder(
            collector=f"http://127.0.0.1:{port}", spool_dir=Path(tmp) / "spool", retry_interval_s=0.5
        )
        policy = PolicyHolder(ScriptedTinkerSampler(["a short reply"]), load_tokenizer(BUILTIN_MODEL), "m")
        server = BackgroundServer(create_app(policy, recorder=recorder)).start()
        answered: list[str] = []
        lock, stop = threading.Lock(), threading.Event()

        def agent(worker: int) -> None:
            n = 0
            while not stop.is_set():
                base = f"{server.url}/rollouts/w{worker}-{n}/v1"
                client = openai.OpenAI(base_url=base, api_key="x", max_retries=0)
                reply = client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=8
                )
                with lock:
                    answered.append(reply.id)
                n += 1

        threads = [threading.Thread(target=agent, args=(w,)) for w in range(clients)]
        for thread in threads:
            thread.start()
        time.sleep(seconds / 2)
        collector.kill()  # SIGKILL: the collector loses whatever it had not made durable
        collector.wait()
        killed_at = len(answered)
        time.sleep(2.0)
        collector = start_collector()
        time.sleep(seconds / 2)
        stop.set()
        for thread in threads:
            thread.join()
        delivered = recorder.flush(60)
        stats = recorder.stats()
        server.stop()
        collector.terminate()
        collector.wait(timeout=60)
        con = duckdb.connect()
        open_spans(con, out)
        stored = {
            r[0]
            for r in con.execute("SELECT DISTINCT response_id FROM spans WHERE span_type = 'llm'").fetchall()
        }
    lost = set(answered) - stored
    print(f"load: {os.getloadavg()[0]:.2f} (1-min average), {os.cpu_count()} CPUs")
    print(
        f"{len(answered)} calls answered in {seconds:.0f} s by {clients} clients "
        f"({killed_at} before the kill); collector SIGKILLed midway, back 2 s later; "
        f"flush {'complete' if delivered else 'INCOMPLETE'}"
    )
    print(f"stored LLM spans: {len(stored & set(answered))}; lost: {len(lost)}; exporter: {stats}")
    what = f"{clients} clients for {seconds:.0f} s, collector SIGKILLed midway"
    result.add("answered", len(answered), "calls", f"{what}: calls answered")
    result.add("lost", len(lost), "calls", f"{what}: answered calls whose span never reached Parquet")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    c = sub.add_parser("cost", help="per-call cost of recording (interleaved pairs)")
    c.add_argument("--pairs", type=int, default=100)
    c.add_argument("--max-tokens", type=int, default=20)
    c.add_argument("--warmup", type=int, default=5)
    d = sub.add_parser("durable", help="latency and throughput, durable answers vs not (interleaved)")
    d.add_argument("--agents", type=int, nargs="+", default=[1, 64], help="concurrency levels, in turn")
    d.add_argument("--rounds", type=int, default=6)
    d.add_argument("--round-s", type=float, default=5.0)
    r = sub.add_parser("restart", help="calls lost across a collector restart under load")
    r.add_argument("--seconds", type=float, default=20.0)
    r.add_argument("--clients", type=int, default=4)
    record.add_arguments(parser)
    args = parser.parse_args()
    result = record.start(__file__, MEASURES, args, variant=args.what)
    if args.what == "cost":
        cost(result, args.pairs, args.max_tokens, args.warmup)
    elif args.what == "durable":
        durable(result, args.agents, args.rounds, args.round_s)
    else:
        restart(result, args.seconds, args.clients)
    result.save()


if __name__ == "__main__":
    main()
