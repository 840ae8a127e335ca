"""OTLP logs: ``POST /v1/logs`` (protobuf and JSON) and gRPC ``LogsService/Export`` into durable
Parquet under ``<out>/_logs`` with the ``logs`` schema; bad input answered, nothing else lost."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import duckdb
import grpc
import httpx
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)

from tinkertrace import schemas
from tinkertrace.spanstore.reader import list_span_files

TRACE, SPAN = bytes(range(1, 17)), bytes(range(1, 9))


def _request(*span_ids: bytes, event: str = "gen_ai.evaluation.result") -> ExportLogsServiceRequest:
    request = ExportLogsServiceRequest()
    resource_logs = request.resource_logs.add()
    kv = resource_logs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "agent"
    scope = resource_logs.scope_logs.add()
    scope.scope.name = "app"
    for span_id in span_ids:
        record = scope.log_records.add(
            trace_id=TRACE, span_id=span_id, time_unix_nano=1_000, event_name=event
        )
        attr = record.attributes.add()
        attr.key, attr.value.double_value = "gen_ai.evaluation.score.value", 0.5
        record.body.string_value = "scored"
    return request


def _rows(out: Path) -> list[dict]:
    files = list_span_files(out / "_logs")
    assert files and not set(files) & set(list_span_files(out))  # span readers skip _logs/
    listing = ", ".join(f"'{f}'" for f in files)
    con = duckdb.connect()
    times = "time, observed_time, received_at"  # nanosecond timestamps: not Python datetimes
    query = f"SELECT * EXCLUDE ({times}) FROM read_parquet([{listing}], hive_partitioning = false)"
    query += " ORDER BY received_at"
    return con.sql(query).to_arrow_table().to_pylist()


def test_logs_over_http_and_grpc_land_in_their_own_parquet(start_collector: Callable, tmp_path: Path) -> None:
    collector = start_collector()
    logs_url = collector.url.replace("/v1/traces", "/v1/logs")
    proto = httpx.post(logs_url, content=_request(SPAN).SerializeToString(),
                       headers={"content-type": "application/x-protobuf"})  # fmt: skip
    assert proto.status_code == 200
    assert ExportLogsServiceResponse.FromString(proto.content).partial_success.rejected_log_records == 0
    document = {"resourceLogs": [{"scopeLogs": [{"logRecords": [
        {"traceId": TRACE.hex(), "spanId": SPAN.hex(), "timeUnixNano": "2000", "eventName": "gen_ai.x",
         "body": {"stringValue": "json"}}]}]}]}  # fmt: skip
    as_json = httpx.post(logs_url, json=document)
    assert as_json.status_code == 200, as_json.text
    # a record with a malformed span id is rejected and counted; its neighbour is kept
    partial = httpx.post(logs_url, content=_request(b"\x01\x02", SPAN).SerializeToString(),
                         headers={"content-type": "application/x-protobuf"})  # fmt: skip
    answer = ExportLogsServiceResponse.FromString(partial.content).partial_success
    assert (partial.status_code, answer.rejected_log_records) == (
        200,
        1,
    ) and "span id" in answer.error_message
    bad = httpx.post(
        logs_url, content=b"\xff\xff not protobuf", headers={"content-type": "application/x-protobuf"}
    )
    assert bad.status_code == 400 and "ExportLogsServiceRequest" in bad.text
    with grpc.insecure_channel(collector.grpc_target) as channel:
        export = channel.unary_unary(
            "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
            request_serializer=ExportLogsServiceRequest.SerializeToString,
            response_deserializer=ExportLogsServiceResponse.FromString,
        )
        export(_request(SPAN, event="gen_ai.client.inference.operation.details"), timeout=30)
    collector.stop()

    rows = _rows(collector.out)
    assert len(rows) == 4 and set(rows[0]) == set(schemas.logs().names) - {
        "time",
        "observed_time",
        "received_at",
    }
    assert [r["event_name"] for r in rows] == [
        "gen_ai.evaluation.result", "gen_ai.x", "gen_ai.evaluation.result",
        "gen_ai.client.inference.operation.details",
    ]  # fmt: skip
    assert {(r["trace_id"], r["span_id"]) for r in rows} == {(TRACE.hex(), SPAN.hex())}
    assert json.loads(rows[0]["attributes"]) == {"gen_ai.evaluation.score.value": 0.5}
    assert [r["body"] for r in rows[:2]] == ['"scored"', '"json"']
    assert rows[0]["service_name"] == "agent" and rows[0]["scope_name"] == "app"
