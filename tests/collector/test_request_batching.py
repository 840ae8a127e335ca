"""Requests converted as one (otlp_http): bodies that complete in the same event-loop turn, and
requests that arrive while a conversion waits for the WAL."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from tinkertrace.collector import otlp_http
from tinkertrace.collector.http_server import Request, Response
from tinkertrace.collector.ingest import IngestConfig, Ingestor
from tinkertrace.collector.otlp_http import OtlpHttpHandler
from tinkertrace.spanstore.samples import llm_request

HEADERS = {b"content-type": b"application/x-protobuf"}


def _answer_together(handler: OtlpHttpHandler, bodies: list[bytes]) -> list[Response]:
    """Hand all requests to the handler in one event-loop turn, as the server does for bodies that
    complete together."""

    async def main() -> list[Response]:
        requests = [Request("POST", "/v1/traces", HEADERS, body) for body in bodies]
        return await asyncio.gather(*(handler.respond(request) for request in requests))

    return asyncio.run(main())


def _stored_span_ids(out: Path) -> list[str]:
    rows = duckdb.sql(f"SELECT span_id FROM read_parquet('{out}/**/*.parquet') ORDER BY span_id").fetchall()
    return [span_id for (span_id,) in rows]


def _ids(request: object) -> list[str]:
    return [s.span_id.hex() for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]  # type: ignore[attr-defined]


def _ingestor(tmp_path: Path) -> Ingestor:
    out = tmp_path / "spans"
    ingestor = Ingestor(IngestConfig(out=out, wal_dir=out / "_wal" / "t", instance="t"))
    ingestor.start()
    return ingestor


def test_good_requests_arriving_together_share_one_conversion(tmp_path: Path) -> None:
    ingestor = _ingestor(tmp_path)
    handler = OtlpHttpHandler(ingestor, max_request_bytes=1 << 24)
    requests = [llm_request(n, seed=seed) for n, seed in ((3, 1), (5, 2), (1, 3))]
    responses = _answer_together(handler, [r.SerializeToString() for r in requests])
    ingestor.stop()
    assert [r.status for r in responses] == [200, 200, 200]
    assert all(
        ExportTraceServiceResponse.FromString(r.body) == ExportTraceServiceResponse() for r in responses
    )
    assert ingestor.stats["requests"] == 3 and ingestor.stats["batched_requests"] == 3
    assert _stored_span_ids(ingestor.config.out) == sorted(id_ for r in requests for id_ in _ids(r))


def test_a_bad_request_among_good_ones_gets_its_own_answer(tmp_path: Path) -> None:
    ingestor = _ingestor(tmp_path)
    handler = OtlpHttpHandler(ingestor, max_request_bytes=1 << 24)
    good = llm_request(4, seed=1)
    partly_bad = llm_request(3, seed=2)
    partly_bad.resource_spans[0].scope_spans[0].spans[1].span_id = b"\x00" * 8  # rejected: zero id
    whole = llm_request(2, seed=3).SerializeToString()
    bodies = [
        good.SerializeToString(),
        whole[: len(whole) // 2],  # truncated: would swallow the next request's bytes if merged
        partly_bad.SerializeToString(),
        b"\xff\xfe not protobuf",
        whole,
    ]
    responses = _answer_together(handler, bodies)
    ingestor.stop()
    assert [r.status for r in responses] == [200, 400, 200, 400, 200]
    partial = ExportTraceServiceResponse.FromString(responses[2].body).partial_success
    assert partial.rejected_spans == 1 and "resource_spans[0] span[1]" in partial.error_message
    assert ingestor.stats["batched_requests"] == 0  # the rejected span made it convert one by one
    expected = _ids(good) + [i for i in _ids(partly_bad) if i != "0" * 16] + _ids(llm_request(2, seed=3))
    assert _stored_span_ids(ingestor.config.out) == sorted(expected)


def test_a_request_that_breaks_the_merged_conversion_is_answered_alone(tmp_path: Path) -> None:
    ingestor = _ingestor(tmp_path)
    handler = OtlpHttpHandler(ingestor, max_request_bytes=1 << 24)
    first, second = llm_request(2, seed=5), llm_request(3, seed=6)
    # whole top-level fields, but the span inside is garbage: the merged conversion fails, each is retried
    bad = b"\x0a\x03\x12\x01\xff"
    responses = _answer_together(handler, [first.SerializeToString(), bad, second.SerializeToString()])
    ingestor.stop()
    assert [r.status for r in responses] == [200, 400, 200]
    assert ingestor.stats["batched_requests"] == 0
    assert _stored_span_ids(ingestor.config.out) == sorted(_ids(first) + _ids(second))


def _slow_wal_handler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Ingestor, OtlpHttpHandler]:
    """An ingestor whose WAL fsyncs take 0.4 s longer (so later requests arrive while one is logged),
    and a handler in front of it."""
    ingestor = _ingestor(tmp_path)
    sync = ingestor.wal.sync

    def slow_sync() -> None:
        time.sleep(0.4)
        sync()

    monkeypatch.setattr(ingestor.wal, "sync", slow_sync)
    return ingestor, OtlpHttpHandler(ingestor, max_request_bytes=1 << 24)


def _one_then_more(
    handler: OtlpHttpHandler, ingestor: Ingestor, bodies: list[bytes]
) -> tuple[list[Response], int]:
    """Send the first request, the others 0.1 s later (while the first is being logged by a slow WAL);
    the answers, and how many requests were submitted at 0.25 s (the first still being logged)."""

    async def respond_later(body: bytes, delay: float) -> Response:
        await asyncio.sleep(delay)
        return await handler.respond(Request("POST", "/v1/traces", HEADERS, body))

    async def main() -> tuple[list[Response], int]:
        answers = [asyncio.ensure_future(respond_later(b, 0.1 if i else 0)) for i, b in enumerate(bodies)]
        await asyncio.sleep(0.25)
        submitted = ingestor.stats["requests"]
        return await asyncio.gather(*answers), submitted

    return asyncio.run(main())


def test_requests_arriving_while_a_conversion_waits_for_the_wal_are_converted_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ingestor, handler = _slow_wal_handler(tmp_path, monkeypatch)
    requests = [llm_request(n, seed=seed) for n, seed in ((4, 21), (2, 22), (3, 23))]
    bodies = [r.SerializeToString() for r in requests]
    responses, submitted_meanwhile = _one_then_more(handler, ingestor, bodies)
    ingestor.stop()
    assert [r.status for r in responses] == [200, 200, 200]
    assert submitted_meanwhile == 1  # the later two waited for the first's WAL write
    assert ingestor.stats["requests"] == 3 and ingestor.stats["batched_requests"] == 2
    assert _stored_span_ids(ingestor.config.out) == sorted(id_ for r in requests for id_ in _ids(r))


def test_enough_waiting_bytes_are_converted_without_waiting_for_the_wal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ingestor, handler = _slow_wal_handler(tmp_path, monkeypatch)
    bodies = [llm_request(4, seed=seed).SerializeToString() for seed in (31, 32)]
    monkeypatch.setattr(otlp_http, "BATCH_BYTES", len(bodies[1]))
    responses, submitted_meanwhile = _one_then_more(handler, ingestor, bodies)
    ingestor.stop()
    assert [r.status for r in responses] == [200, 200]
    assert submitted_meanwhile == 2  # the second did not wait for the first's WAL write


def _post_at_once(port: int, bodies: list[bytes]) -> list[int]:
    """Send every request on its own connection before reading any answer; the status codes."""
    sockets = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in bodies]
    for sock, body in zip(sockets, bodies, strict=True):
        head = "POST /v1/traces HTTP/1.1\r\nhost: x\r\ncontent-type: application/x-protobuf\r\n"
        sock.sendall(f"{head}content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode() + body)
    statuses = []
    for sock in sockets:
        with sock, sock.makefile("rb") as answer:
            statuses.append(int(answer.readline().split()[1]))
    return statuses


@pytest.mark.slow
def test_concurrent_clients_of_the_collector_process_are_batched_and_stored_once(
    start_collector: Callable[..., Any],
) -> None:
    collector = start_collector()
    health_url = collector.url.replace("/v1/traces", "/health")
    sent: list[str] = []
    batched = 0
    for round_ in range(20):  # a batch needs bodies that complete while the loop is busy: usually round 0
        requests = [llm_request(64, seed=1000 * round_ + i) for i in range(8)]
        assert _post_at_once(collector.http_port, [r.SerializeToString() for r in requests]) == [200] * 8
        sent += [id_ for r in requests for id_ in _ids(r)]
        batched = httpx.get(health_url).json()["batched_requests"]
        if batched:
            break
    assert batched >= 2
    collector.stop()
    stored = collector.query("SELECT span_id FROM spans ORDER BY span_id")
    assert [span_id for (span_id,) in stored] == sorted(sent)
