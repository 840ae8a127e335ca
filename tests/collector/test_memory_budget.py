"""One memory budget (``--max-queue-mb``): bodies being received count from their head on, so at the
budget a request gets 429 + Retry-After before its body is read; what a lost connection held is given
back."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx

from tinkertrace.collector.http_server import HttpServer
from tinkertrace.collector.ingest import IngestConfig, Ingestor
from tinkertrace.collector.otlp_http import OtlpHttpHandler
from tinkertrace.netutil import free_port
from tinkertrace.spanstore.samples import llm_request

HEAD = b"POST /v1/traces HTTP/1.1\r\ncontent-type: application/x-protobuf\r\ncontent-length: %d\r\n\r\n"


def test_bodies_in_flight_count_against_the_budget_and_are_given_back(tmp_path: Path) -> None:
    out = tmp_path / "spans"
    budget = 1_000_000
    ingestor = Ingestor(
        IngestConfig(out=out, wal_dir=out / "_wal" / "x", instance="x", max_queue_bytes=budget)
    )
    ingestor.start()
    server = HttpServer(
        OtlpHttpHandler(ingestor, max_request_bytes=1 << 24), "127.0.0.1", free_port(), max_body_bytes=1 << 24
    )
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as slow:
            slow.sendall(HEAD % 900_000 + b"\x0a" * 1000)  # admitted: 900 kB of the budget are held
            deadline = time.monotonic() + 5
            while ingestor.budget.used < 900_000 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert ingestor.budget.used == 900_000
            with socket.create_connection(("127.0.0.1", server.port)) as refused:
                refused.sendall(HEAD % 500_000)  # the head only: the answer comes before any body byte
                refused.settimeout(5)
                answer = refused.recv(65536)
            assert answer.startswith(b"HTTP/1.1 429") and b"retry-after: 1" in answer
        deadline = time.monotonic() + 5  # the slow client went away: its reservation is given back
        while ingestor.budget.used and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ingestor.budget.used == 0
        body = llm_request(20, seed=1).SerializeToString()
        url = f"http://127.0.0.1:{server.port}/v1/traces"
        response = httpx.post(url, content=body, headers={"content-type": "application/x-protobuf"})
        assert response.status_code == 200
        assert httpx.get(url.replace("/v1/traces", "/health")).json()["overloaded"] == 1
    finally:
        server.stop()
        ingestor.stop()
    assert ingestor.budget.used == 0 and ingestor.writer.rows_written == 20
