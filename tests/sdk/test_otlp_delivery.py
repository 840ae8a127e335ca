"""OTLP export while the collector is down: the agent is unaffected, every span arrives later.

Uses the real collector (``python -m tinkertrace.collector``) as a subprocess on a loopback port
that accepts nothing until the collector starts.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import duckdb
import httpx
import pytest

import tinkertrace
from tinkertrace.netutil import free_ports, wait_for_port
from tinkertrace.spanstore.reader import open_spans

ROLLOUTS = 5


def _start_collector(out: Path, http_port: int, grpc_port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tinkertrace.collector", "--out", str(out), "--http-port", str(http_port)]
    cmd += ["--grpc-port", str(grpc_port), "--roll-seconds", "0.3"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for_port(http_port, timeout=60)
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
        assert time.perf_counter() - started < 2.0  # the agent never waited on the exporter
        assert tinkertrace.flush(timeout_s=2) is False  # nothing listens: spooled, not lost
        stats = tinkertrace.stats()
        assert stats["spans_spooled"] == 3 * ROLLOUTS and stats["spans_dropped"] == 0
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
