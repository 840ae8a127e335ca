"""Acceptance: official OTel exporters and raw OTLP/JSON into a real collector process, read by DuckDB."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tinkertrace import semconv
from tinkertrace.packing import pack_ids, pack_logprobs
from tinkertrace.spanstore.samples import llm_request

pytestmark = pytest.mark.slow


def _emit(exporter: SpanExporter, service: str) -> list[ReadableSpan]:
    """One rollout with three LLM spans (packed and plain-array tokens) and events; returns what was sent."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("e2e-test")
    rollout = {
        semconv.SPAN_TYPE: semconv.TYPE_ROLLOUT,
        semconv.ROLLOUT_ID: f"r-{service}",
        semconv.TASK_ID: "t1",
    }
    with tracer.start_as_current_span("rollout", attributes=rollout):
        for i in range(3):
            prompt = list(range(100 * i, 100 * i + 50))
            attributes = {
                **rollout,
                semconv.SPAN_TYPE: semconv.TYPE_LLM,
                semconv.GENAI_REQUEST_MODEL: "tiny",
                semconv.GENAI_INPUT_TOKENS: 50,
                semconv.POLICY_VERSION: 7,
            }
            if i % 2 == 0:  # our SDK's packed form
                attributes[semconv.PROMPT_TOKEN_IDS] = pack_ids(prompt)
                attributes[semconv.RESPONSE_TOKEN_IDS] = pack_ids([1, 2, 3])
                attributes[semconv.RESPONSE_LOGPROBS] = pack_logprobs([-0.5, -0.25, -1.0])
            else:  # any other producer: plain arrays
                attributes[semconv.PROMPT_TOKEN_IDS] = prompt
                attributes[semconv.RESPONSE_TOKEN_IDS] = [1, 2, 3]
                attributes[semconv.RESPONSE_LOGPROBS] = [-0.5, -0.25, -1.0]
            with tracer.start_as_current_span(
                "chat tiny", kind=SpanKind.CLIENT, attributes=attributes
            ) as span:
                span.add_event("gen_ai.choice", {"index": i, "finish_reason": "stop"})
    provider.shutdown()
    return list(memory.get_finished_spans())


def _check_stored(collector: Any, sent: list[ReadableSpan], service: str) -> None:
    rows = collector.query(
        "SELECT trace_id, span_id, parent_span_id, name, kind, span_type, rollout_id, model, policy_version, "
        "prompt_token_ids, response_token_ids, response_logprobs, attributes, events, scope_name "
        f"FROM spans WHERE service_name = '{service}'"
    )
    by_id = {row[1]: row for row in rows}
    assert len(rows) == len(sent) == 4
    for span in sent:
        row = by_id[f"{span.context.span_id:016x}"]
        assert row[0] == f"{span.context.trace_id:032x}"
        assert row[2] == (f"{span.parent.span_id:016x}" if span.parent else None)
        assert row[3] == span.name and row[6] == f"r-{service}" and row[14] == "e2e-test"
        if span.name == "rollout":
            assert row[5] == "rollout" and row[9] is None and row[4] == "INTERNAL"
            continue
        assert row[4] == "CLIENT" and row[5] == "llm" and row[7] == "tiny" and row[8] == 7
        expected_prompt = (
            np.frombuffer(span.attributes[semconv.PROMPT_TOKEN_IDS], "<i4").tolist()
            if isinstance(span.attributes[semconv.PROMPT_TOKEN_IDS], bytes)
            else list(span.attributes[semconv.PROMPT_TOKEN_IDS])
        )
        assert row[9] == expected_prompt
        assert row[10] == [1, 2, 3]
        assert row[11] == pytest.approx([-0.5, -0.25, -1.0])
        assert json.loads(row[12])[semconv.GENAI_INPUT_TOKENS] == 50
        event = json.loads(row[13])[0]
        assert event["name"] == "gen_ai.choice" and event["attributes"]["finish_reason"] == "stop"


def test_official_exporters_http_and_grpc(start_collector: Callable[..., Any]) -> None:
    collector = start_collector()
    sent_http = _emit(HttpExporter(endpoint=collector.url, compression=Compression.Gzip), "via-http")
    sent_grpc = _emit(GrpcExporter(endpoint=collector.grpc_target, insecure=True), "via-grpc")
    assert collector.proc is not None  # its pipeline threads are named for top -H and the benchmark
    tasks = Path(f"/proc/{collector.proc.pid}/task")
    assert {"tt-http", "tt-wal", "tt-parquet"} <= {(t / "comm").read_text().strip() for t in tasks.iterdir()}
    output = collector.stop()
    assert "listening on OTLP/HTTP" in output and "stopped; 8 spans accepted" in output
    _check_stored(collector, sent_http, "via-http")
    _check_stored(collector, sent_grpc, "via-grpc")
    assert collector.query("SELECT count(*), count(DISTINCT span_id) FROM spans") == [(8, 8)]


def _json_request(trace_hex: str, span_ids: list[str]) -> dict:
    spans = [
        {
            "traceId": trace_hex,
            "spanId": span_id,
            "name": f"json-{n}",
            "kind": 3,
            "startTimeUnixNano": "1767225600000000000",
            "endTimeUnixNano": "1767225601000000000",
            "attributes": [
                {"key": semconv.ROLLOUT_ID, "value": {"stringValue": "json-rollout"}},
                {"key": semconv.ATTEMPT, "value": {"intValue": "2"}},
                {"key": semconv.RESPONSE_TOKEN_IDS, "value": {"arrayValue": {"values": [{"intValue": "5"}]}}},
            ],
            "events": [{"name": "evt", "timeUnixNano": "1767225600500000000"}],
            "status": {"code": 2, "message": "boom"},
        }
        for n, span_id in enumerate(span_ids)
    ]
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "json-svc"}}]},
                "scopeSpans": [{"scope": {"name": "raw"}, "spans": spans}],
            }
        ]
    }


def test_http_json_with_hex_ids_and_partial_success(start_collector: Callable[..., Any]) -> None:
    collector = start_collector()
    trace = "0af7651916cd43dd8448eb211c80319c"
    good = ["b7ad6b7169203331", "00f067aa0ba902b7"]
    document = _json_request(trace, [*good, ""])  # the last span has no span id: rejected
    response = httpx.post(
        collector.url,
        content=gzip.compress(json.dumps(document).encode()),
        headers={"content-type": "application/json", "content-encoding": "gzip"},
    )
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    partial = response.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "1" and "span_id must be 8 non-zero bytes" in partial["errorMessage"]
    collector.stop()
    rows = collector.query(
        "SELECT trace_id, span_id, kind, status_code, status_message, attempt, response_token_ids, events "
        "FROM spans ORDER BY name"
    )
    assert [(r[0], r[1]) for r in rows] == [(trace, good[0]), (trace, good[1])]
    assert rows[0][2:7] == ("CLIENT", "ERROR", "boom", 2, [5])
    assert json.loads(rows[0][7]) == [
        {"name": "evt", "time_unix_nano": 1767225600500000000, "attributes": {}}
    ]


def test_zstd_level_option_compresses_the_files(start_collector: Callable[..., Any], tmp_path: Path) -> None:
    """``--zstd-level`` reaches the Parquet writer: the same spans at level 19 take less room than at -7."""
    body = llm_request(200, seed=3).SerializeToString()
    sizes = {}
    for level in ("-7", "19"):
        collector = start_collector("--zstd-level", level, out=tmp_path / f"level{level}")
        response = httpx.post(collector.url, content=body, headers={"content-type": "application/x-protobuf"})
        assert response.status_code == 200
        collector.stop()
        assert collector.query("SELECT count(*) FROM spans") == [(200,)]
        sizes[level] = sum(path.stat().st_size for path in collector.out.rglob("*.parquet"))
    assert sizes["19"] < 0.97 * sizes["-7"]  # 6% smaller when measured
