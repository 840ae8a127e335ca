"""One request's content never decides another's answer: each is validated and converted on its own
(collector/pipeline.py), whatever arrives with it, over OTLP/HTTP and OTLP/gRPC."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import duckdb
import grpc
import pytest
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from tinkertrace.collector.http_server import Request, Response
from tinkertrace.collector.ingest import IngestConfig, Ingestor
from tinkertrace.collector.otlp_grpc import start_grpc_server
from tinkertrace.collector.otlp_http import OtlpHttpHandler
from tinkertrace.netutil import free_port
from tinkertrace.spanstore.convert import compiled_decoder
from tinkertrace.spanstore.samples import llm_request

PROTOBUF = b"application/x-protobuf"
JSON = b"application/json"


def _ingestor(tmp_path: Path) -> Ingestor:
    out = tmp_path / "spans"
    ingestor = Ingestor(IngestConfig(out=out, wal_dir=out / "_wal" / "t", instance="t"))
    ingestor.start()
    return ingestor


def _answer_together(handler: OtlpHttpHandler, requests: list[tuple[bytes, bytes]]) -> list[Response]:
    """Hand (content type, body) requests to the handler in one event-loop turn, as the server does
    for bodies that complete together."""

    async def main() -> list[Response]:
        made = [Request("POST", "/v1/traces", {b"content-type": kind}, body) for kind, body in requests]
        return await asyncio.gather(*(handler.respond(request) for request in made))

    return asyncio.run(main())


def _ids(request: object) -> list[str]:
    return [s.span_id.hex() for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]  # type: ignore[attr-defined]


def _stored_span_ids(out: Path) -> list[str]:
    if not list(out.rglob("*.parquet")):
        return []
    rows = duckdb.sql(f"SELECT span_id FROM read_parquet('{out}/**/*.parquet') ORDER BY span_id").fetchall()
    return [span_id for (span_id,) in rows]


def _wal_records(ingestor: Ingestor, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every payload the ingestor appends to its WAL, from now on."""
    logged: list[bytes] = []
    append = ingestor.wal.append

    def spy(payload: bytes, received_at_ns: int) -> None:
        logged.append(payload)
        append(payload, received_at_ns)

    monkeypatch.setattr(ingestor.wal, "append", spy)
    return logged


def test_empty_requests_among_others_are_answered_200_and_log_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ingestor = _ingestor(tmp_path)
    logged = _wal_records(ingestor, monkeypatch)
    handler = OtlpHttpHandler(ingestor, max_request_bytes=1 << 24)
    first, second, later = llm_request(3, seed=1), llm_request(2, seed=2), llm_request(1, seed=3)
    requests = [
        (PROTOBUF, first.SerializeToString()),
        (PROTOBUF, b""),
        (JSON, b"{}"),
        (PROTOBUF, second.SerializeToString()),
    ]
    responses = _answer_together(handler, requests)
    assert [r.status for r in responses] == [200, 200, 200, 200]
    assert json.loads(responses[2].body) == {}
    assert _answer_together(handler, [(PROTOBUF, later.SerializeToString())])[0].status == 200
    assert handler.health()["status"] == "ok"
    ingestor.stop()
    assert logged == [first.SerializeToString(), second.SerializeToString(), later.SerializeToString()]
    assert _stored_span_ids(ingestor.config.out) == sorted(_ids(first) + _ids(second) + _ids(later))


def test_a_time_beyond_int64_rejects_only_that_span(tmp_path: Path) -> None:
    ingestor = _ingestor(tmp_path)
    handler = OtlpHttpHandler(ingestor, max_request_bytes=1 << 24)
    odd, neighbour = llm_request(3, seed=4), llm_request(2, seed=5)
    odd.resource_spans[0].scope_spans[0].spans[1].start_time_unix_nano = 2**63
    odd.resource_spans[0].scope_spans[0].spans[2].end_time_unix_nano = 2**64 - 1
    responses = _answer_together(
        handler, [(PROTOBUF, neighbour.SerializeToString()), (PROTOBUF, odd.SerializeToString())]
    )
    ingestor.stop()
    assert [r.status for r in responses] == [200, 200]
    assert ExportTraceServiceResponse.FromString(responses[0].body) == ExportTraceServiceResponse()
    partial = ExportTraceServiceResponse.FromString(responses[1].body).partial_success
    assert partial.rejected_spans == 2
    assert "span[1]" in partial.error_message and "start_time_unix_nano" in partial.error_message
    kept = _ids(odd)[:1]
    assert _stored_span_ids(ingestor.config.out) == sorted(_ids(neighbour) + kept)


NESTED = [b"[" * 100_000, b'{"resourceSpans":' * 100_000, b'{"resourceSpans":[{"resource":' + b"[" * 50_000]


@pytest.mark.parametrize("body", NESTED)
def test_deeply_nested_json_is_a_400_and_its_neighbours_are_stored(tmp_path: Path, body: bytes) -> None:
    ingestor = _ingestor(tmp_path)
    handler = OtlpHttpHandler(ingestor, max_request_bytes=1 << 24)
    good = llm_request(2, seed=6)
    responses = _answer_together(handler, [(JSON, body), (PROTOBUF, good.SerializeToString())])
    ingestor.stop()
    assert [r.status for r in responses] == [400, 200]
    assert "JSON" in json.loads(responses[0].body)["message"]
    assert _stored_span_ids(ingestor.config.out) == sorted(_ids(good))


def test_grpc_requests_go_through_the_same_pipeline(tmp_path: Path) -> None:
    ingestor = _ingestor(tmp_path)
    port = free_port()
    server = start_grpc_server(ingestor, "127.0.0.1", port, token=None, max_request_bytes=1 << 24)
    odd, good = llm_request(2, seed=7), llm_request(3, seed=8)
    odd.resource_spans[0].scope_spans[0].spans[0].start_time_unix_nano = 2**63 + 5
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
            assert export(b"") == b""
            partial = ExportTraceServiceResponse.FromString(export(odd.SerializeToString())).partial_success
            assert partial.rejected_spans == 1 and "start_time_unix_nano" in partial.error_message
            with pytest.raises(grpc.RpcError) as invalid:
                export(b"\x0a\x03\x12\x01\xff")
            assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert export(good.SerializeToString()) == b""
    finally:
        server.stop(grace=1).wait()
    ingestor.stop()
    assert ingestor.failure is None
    assert _stored_span_ids(ingestor.config.out) == sorted(_ids(odd)[1:] + _ids(good))


def test_an_unexpected_error_in_one_conversion_answers_only_that_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug met by one request (here: a conversion that raises something unforeseen) is that request's
    500; the others are stored."""
    from tinkertrace.collector import pipeline

    ingestor = _ingestor(tmp_path)
    handler = OtlpHttpHandler(ingestor, max_request_bytes=1 << 24)
    good, cursed = llm_request(2, seed=9), llm_request(2, seed=10).SerializeToString()
    convert = pipeline.body_to_table

    def flaky(body: bytes, received_at_ns: int):  # type: ignore[no-untyped-def]
        if body == cursed:
            raise LookupError("a bug")
        return convert(body, received_at_ns)

    monkeypatch.setattr(pipeline, "body_to_table", flaky)
    responses = _answer_together(handler, [(PROTOBUF, cursed), (PROTOBUF, good.SerializeToString())])
    ingestor.stop()
    assert [r.status for r in responses] == [500, 200]
    assert "internal error" in status_pb2.Status.FromString(responses[0].body).message
    assert _stored_span_ids(ingestor.config.out) == sorted(_ids(good))


def test_health_counts_requests_by_decoder_and_fallbacks_by_reason(tmp_path: Path) -> None:
    """A request the compiled decoder declines (a span with links) is stored all the same, converted by
    the reference decoder, and /health counts it under its reason."""
    if compiled_decoder() is None:
        pytest.skip("the compiled decoder needs the collector extra (numba)")
    from tinkertrace.spanstore.convert.compiled import SCAN_DECLINED

    ingestor = _ingestor(tmp_path)
    handler = OtlpHttpHandler(ingestor, max_request_bytes=1 << 24)
    usual, linked = llm_request(3, seed=7), llm_request(2, seed=8)
    span = linked.resource_spans[0].scope_spans[0].spans[0]
    span.links.add(trace_id=span.trace_id, span_id=span.span_id)
    responses = _answer_together(
        handler, [(PROTOBUF, usual.SerializeToString()), (PROTOBUF, linked.SerializeToString())]
    )
    health = handler.health()
    ingestor.stop()
    assert [r.status for r in responses] == [200, 200]
    assert (health["converted_compiled"], health["converted_reference"]) == (1, 1)
    assert health["compiled_fallbacks"] == {SCAN_DECLINED: 1}
    assert _stored_span_ids(ingestor.config.out) == sorted(_ids(usual) + _ids(linked))
