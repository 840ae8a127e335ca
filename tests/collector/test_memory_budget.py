"""One memory budget (``--max-queue-mb``): bodies being received count from their head on, so at the
budget a request gets 429 + Retry-After before its body is read; what a lost connection held is given
back."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx

from tinkertrace.collector.budget import ADMIT_FACTOR, WRITE_FACTOR
from tinkertrace.collector.http_server import HttpServer
from tinkertrace.collector.ingest import IngestConfig, Ingestor, Overloaded
from tinkertrace.collector.otlp_http import OtlpHttpHandler
from tinkertrace.netutil import free_port
from tinkertrace.spanstore.convert import body_to_table
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
            # admitted (alone: it is larger than the budget): the body and its table to come are held
            slow.sendall(HEAD % 900_000 + b"\x0a" * 1000)
            deadline = time.monotonic() + 5
            while ingestor.budget.used < ADMIT_FACTOR * 900_000 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert ingestor.budget.used == ADMIT_FACTOR * 900_000
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


def test_the_budget_keeps_a_files_working_memory_aside_and_the_writer_writes_at_that_size(
    tmp_path: Path,
) -> None:
    """Requests are admitted up to the budget less the working memory of writing one file, and files are
    written once the buffered tables reach that file size (an eighth of the budget), long before a WAL
    roll: what is buffered never grows with the load."""
    out = tmp_path / "spans"
    budget = 8 * 1024 * 1024
    config = IngestConfig(
        out=out,
        wal_dir=out / "_wal" / "x",
        instance="x",
        max_queue_bytes=budget,
        roll_seconds=600,
        idle_flush_s=600,
    )
    ingestor = Ingestor(config)
    assert ingestor.file_bytes == budget // 8
    assert ingestor.budget.admission_limit == budget - int(WRITE_FACTOR * budget // 8)
    ingestor.start()
    try:
        body = llm_request(200, seed=3).SerializeToString()  # ~0.5 MB, so ~4 requests make a file
        for _ in range(12):
            reserved = _admit_when_room(ingestor, len(body))
            result = body_to_table(body, time.time_ns())
            ingestor.submit(body, result, time.time_ns(), reserved=reserved).result(timeout=10)
            assert ingestor.budget.used <= ingestor.budget.admission_limit
        deadline = time.monotonic() + 10
        while ingestor.writer.buffered_bytes >= ingestor.file_bytes and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(ingestor.writer.files_written) >= 2  # written at the file size, not at a roll
        assert ingestor.writer.buffered_bytes < ingestor.file_bytes
    finally:
        ingestor.stop()
    assert ingestor.budget.used == 0 and ingestor.writer.rows_written == 12 * 200


def _admit_when_room(ingestor: Ingestor, nbytes: int) -> int:
    """``ingestor.admit``, retried while the budget is full (as a client retries a 429)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return ingestor.admit(nbytes)
        except Overloaded:
            assert time.monotonic() < deadline, "the budget never made room"
            time.sleep(0.02)
