"""OTLP export while the collector is down: the agent is unaffected, every span arrives later.

Uses the real collector (``tinkertrace collector``) as a subprocess on a loopback port
that accepts nothing until the collector starts.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import tinkertrace
from tinkertrace.builder import build_trajectories
from tinkertrace.collector.launch import collector_command, wait_until_healthy
from tinkertrace.netutil import BackgroundServer, free_ports, wait_for_port
from tinkertrace.sdk.spool import Spool
from tinkertrace.spanstore.reader import open_spans

ROLLOUTS = 5


def _start_collector(out: Path, http_port: int, grpc_port: int) -> subprocess.Popen:
    cmd = collector_command(out, http_port)
    cmd += ["--grpc-port", str(grpc_port), "--roll-seconds", "0.3"]
    with (out.parent / "collector.log").open("ab") as log:  # never a pipe no one reads: it fills and blocks
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    wait_until_healthy(proc, http_port, timeout=60)
    wait_for_port(grpc_port, timeout=60)
    return proc


def _rows_in(out: Path, want: int, timeout: float = 30) -> list[tuple]:
    deadline = time.monotonic() + timeout
    while True:
        con = duckdb.connect()
        open_spans(con, out)
        rows = con.sql("select span_id, span_type, response_token_ids from spans").fetchall()
        if len(rows) >= want or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_collector_down_then_back(openai_server, tmp_path: Path, protocol: str) -> None:
    http_port, grpc_port = free_ports(2)
    endpoint = f"http://127.0.0.1:{http_port}" if protocol == "http" else f"127.0.0.1:{grpc_port}"
    tinkertrace.init(endpoint, protocol=protocol, spool_dir=tmp_path / "spool", retry_interval_s=0.2)

    @tinkertrace.traced_rollout
    def agent(task: int) -> float:
        body = {"model": "m", "messages": [{"role": "user", "content": f"task {task}"}]}
        r = httpx.post(openai_server.base_url + "/chat/completions", json=body)
        return 1.0 if r.json()["choices"][0]["message"]["content"] == f"echo: task {task}" else 0.0

    proc = None
    try:
        started = time.perf_counter()
        assert [agent(i) for i in range(ROLLOUTS)] == [1.0] * ROLLOUTS
        # the agent never waited on the exporter: its retries back off for 1, 2, 4, ... s per batch, so
        # waiting would take well over 10 s; 5 rollouts alone take ~0.3 s (2.3 s seen at load 9 on 2 cores)
        assert time.perf_counter() - started < 10.0
        assert tinkertrace.flush(timeout_s=2) is False  # nothing listens: spooled, not lost
        stats = tinkertrace.stats()
        assert (
            stats["spans_spooled"] == 3 * ROLLOUTS and stats["spans_dropped"] == stats["spans_in_doubt"] == 0
        )
        assert len(list((tmp_path / "spool").glob("*.otlp"))) >= 1

        proc = _start_collector(tmp_path / "collected", http_port, grpc_port)
        assert tinkertrace.flush(timeout_s=20) is True
        stats = tinkertrace.stats()
        assert stats["spans_resent"] == 3 * ROLLOUTS and stats["spans_rejected"] == 0
        assert list((tmp_path / "spool").glob("*.otlp")) == []
        rows = _rows_in(tmp_path / "collected", 3 * ROLLOUTS)
        assert len(rows) == 3 * ROLLOUTS and len({r[0] for r in rows}) == 3 * ROLLOUTS
        assert sorted(r[1] for r in rows) == sorted(["llm", "reward", "rollout"] * ROLLOUTS)
        expected_ids = sorted(list(f"echo: task {i}".encode()) for i in range(ROLLOUTS))
        assert sorted(r[2] for r in rows if r[1] == "llm") == expected_ids
    finally:
        tinkertrace.shutdown()
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)


@pytest.mark.parametrize("status", [400, 401, 413])
def test_refused_batches_are_kept_and_flush_says_so(tmp_path: Path, status: int) -> None:
    """A real endpoint refusing batches, re-sent from the spool or on their first try: each is kept in
    ``spool/rejected/``, counted, and ``flush()`` returns False; moved back into the spool once the
    endpoint takes them, they are sent."""
    answer = {"status": 503}

    async def traces(request: Request) -> Response:
        await request.body()
        return Response(b"", status_code=answer["status"], media_type="application/x-protobuf")

    server = BackgroundServer(Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])).start()
    spool = tmp_path / "spool"
    try:
        tinkertrace.init(server.url, spool_dir=spool, retry_interval_s=60)

        @tinkertrace.traced_rollout
        def agent(task: str) -> float:
            return 1.0

        agent("spooled")  # 503: spooled, then refused when re-sent
        assert tinkertrace.flush(timeout_s=0.1) is False
        answer["status"] = status
        assert tinkertrace.flush(timeout_s=5) is False
        agent("refused")  # refused on its first try
        assert tinkertrace.flush(timeout_s=5) is False
        stats = tinkertrace.stats()
        assert (stats["spans_rejected"], stats["spans_spooled"], stats["spans_exported"]) == (4, 2, 0)
        kept = sorted((spool / "rejected").glob("*.otlp"))
        assert len(kept) == 2 and list(spool.glob("*.otlp")) == []
        assert tinkertrace.flush(timeout_s=5) is True  # each refusal reported once

        answer["status"] = 200
        for path in kept:
            path.rename(spool / path.name)
        assert tinkertrace.flush(timeout_s=5) is True
        assert (tinkertrace.stats()["spans_resent"], tinkertrace.stats()["spans_exported"]) == (4, 4)
        assert list(spool.rglob("*.otlp")) == []
    finally:
        tinkertrace.shutdown()
        server.stop()


def test_an_unanswered_send_is_resent_and_counted_in_doubt(tmp_path: Path) -> None:
    """An endpoint that stores a batch but answers after the client gave up: the batch is spooled and
    re-sent (it is never lost), so the endpoint has it twice, and ``spans_in_doubt`` says how many
    spans that can be."""
    received: list[bytes] = []

    async def traces(request: Request) -> Response:
        received.append(await request.body())
        if len(received) == 1:
            await asyncio.sleep(1.0)  # stored, answered too late
        return Response(b"", media_type="application/x-protobuf")

    server = BackgroundServer(Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])).start()
    try:
        tinkertrace.init(server.url, spool_dir=tmp_path / "spool", retry_interval_s=60, export_timeout_s=0.3)

        @tinkertrace.traced_rollout
        def agent(task: str) -> float:
            return 1.0

        agent("late answer")
        assert tinkertrace.flush(timeout_s=5) is True
        stats = tinkertrace.stats()
        assert (stats["spans_in_doubt"], stats["spans_spooled"], stats["spans_resent"]) == (2, 2, 2)
        assert stats["spans_exported"] == 2 and stats["export_errors"] == 1
        assert len(received) == 2 and received[0] == received[1]  # the same batch, stored twice
    finally:
        tinkertrace.shutdown()
        server.stop()


AGENT_PROCESS = """
import json, pathlib, sys, time
import tinkertrace
from tinkertrace.sdk import runtime

endpoint, spool, go, name = sys.argv[1:]
tinkertrace.init(endpoint, spool_dir=spool, retry_interval_s=0.05, batch_size=4, schedule_delay_s=0.02,
                 export_timeout_s=2)

@tinkertrace.traced_rollout
def agent(task: str) -> float:
    return 1.0

n, stop_at = 0, None
while stop_at is None or time.monotonic() < stop_at:
    agent(f"{name}-{n}")
    n += 1
    time.sleep(0.02)
    if stop_at is None and pathlib.Path(go).exists():
        stop_at = time.monotonic() + 1.0  # keep producing while the shared spool drains
flushed = tinkertrace.flush(timeout_s=60)
counts = runtime.current().stats
tinkertrace.shutdown()  # its last re-sends (of batches others spooled meanwhile) count too
print(json.dumps({"rollouts": n, "flushed": flushed, **counts.snapshot()}))
"""


@pytest.mark.slow
def test_processes_sharing_a_spool_resend_each_batch_once(tmp_path: Path) -> None:
    """Three agent processes, one endpoint, one spool folder, an outage: every span stored, none twice
    but those of sends that got no answer (OTLP is at-least-once: under load a 2 s export timeout can
    expire after the collector stored the batch), each rollout and reward built once, and the
    processes' stats add up exactly. Re-sending each other's batches stores many spans twice with no
    send in doubt, and fails here."""
    http_port, grpc_port = free_ports(2)
    spool, go = tmp_path / "spool", tmp_path / "go"
    spool.mkdir()
    argv = [sys.executable, "-c", AGENT_PROCESS, f"http://127.0.0.1:{http_port}", str(spool), str(go)]
    agents = [subprocess.Popen([*argv, f"p{i}"], stdout=subprocess.PIPE) for i in range(3)]
    collector = None
    try:
        deadline = time.monotonic() + 60
        while len({p.name.split("-")[1] for p in spool.glob("*.otlp")}) < 3:  # each has spooled
            assert time.monotonic() < deadline, "the agents spooled nothing"
            time.sleep(0.1)
        collector = _start_collector(tmp_path / "collected", http_port, grpc_port)
        go.touch()
        reports = [json.loads(p.communicate(timeout=120)[0]) for p in agents]
    finally:
        for p in agents:
            p.kill()
        if collector is not None:
            collector.terminate()
            collector.wait(timeout=30)
    total = sum(2 * r["rollouts"] for r in reports)
    rows = _rows_in(tmp_path / "collected", total, timeout=10)
    assert len({r[0] for r in rows}) == total  # nothing lost
    assert len(rows) - total <= sum(r["spans_in_doubt"] for r in reports)  # twice only if unanswered
    summary = build_trajectories(tmp_path / "collected").summary
    assert summary.rollouts_built == summary.rewards == total // 2 and summary.rollouts_incomplete == {}
    assert all(r["flushed"] for r in reports)
    assert sum(r["spans_exported"] for r in reports) == total
    assert sum(r["spans_resent"] for r in reports) == sum(r["spans_spooled"] for r in reports) > 0
    assert sum(r["spans_rejected"] + r["spans_dropped"] for r in reports) == 0
    assert list(spool.glob("*.otlp*")) == []


def test_claim_of_a_dead_process_is_released(tmp_path: Path) -> None:
    """A process that died while re-sending leaves its claim; the next process gives it back."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    spool = Spool(tmp_path)
    batch = spool.put(b"payload", 3)
    mine = spool.claim(batch)
    assert mine is not None and spool.pending() == [] and spool.claim(batch) is None
    orphan = mine.with_name(batch.name + f".claim-{socket.gethostname()}-{dead.pid}")
    mine.rename(orphan)
    assert spool.release_stale_claims() == 1
    assert spool.pending() == [batch] and batch.read_bytes() == b"payload" and Spool.span_count(batch) == 3
    live = spool.claim(batch)  # this process's own claim is never taken from it
    assert spool.release_stale_claims() == 0 and live is not None and live.exists()
