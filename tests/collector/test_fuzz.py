"""Fuzz: random, truncated and bit-flipped protobuf and JSON bodies (some gzipped), sent at the same time
as valid requests of other clients, to a real collector process. Every valid request is acknowledged
(200, nothing rejected) and stored exactly once; no bad body gets a 5xx; the collector stays healthy."""

from __future__ import annotations

import base64
import gzip
import itertools
import json
import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from tinkertrace.spanstore.samples import llm_request

PROTOBUF, JSON = "application/x-protobuf", "application/json"


def otlp_json(request: Any) -> bytes:
    """OTLP/JSON of a request: protobuf's JSON mapping with trace and span ids as hex."""
    document = json_format.MessageToDict(request)
    for resource_spans in document.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(document).encode()


VICTIM = llm_request(4, prompt_tokens=12, response_tokens=4, seed=99_999)  # bad bodies are made from it
VICTIM_BODIES = {PROTOBUF: VICTIM.SerializeToString(), JSON: otlp_json(VICTIM)}


@st.composite
def bad_body(draw: st.DrawFn) -> tuple[str, bytes, bool]:
    """(content type, body, gzip it)."""
    content_type = draw(st.sampled_from([PROTOBUF, JSON]))
    source = VICTIM_BODIES[content_type]
    how = draw(st.sampled_from(["random", "truncated", "flipped", "empty"]))
    if how == "random":
        body = draw(st.binary(max_size=3000))
    elif how == "truncated":
        body = source[: draw(st.integers(0, len(source) - 1))]
    elif how == "flipped":
        flipped = bytearray(source)
        for bit in draw(st.lists(st.integers(0, len(source) * 8 - 1), min_size=1, max_size=12)):
            flipped[bit // 8] ^= 1 << (bit % 8)
        body = bytes(flipped)
    else:
        body = b"" if content_type == PROTOBUF else b"{}"
    return content_type, body, draw(st.booleans())


@pytest.mark.slow
def test_bad_bodies_never_harm_valid_requests_of_other_clients(start_collector: Callable[..., Any]) -> None:
    collector = start_collector()
    seeds = itertools.count(1)
    valid_ids: list[str] = []
    bad_statuses: dict[int, int] = {}
    pool = ThreadPoolExecutor(max_workers=6)
    clients = [httpx.Client(timeout=30) for _ in range(6)]

    def post(client: httpx.Client, content_type: str, body: bytes, gzipped: bool) -> httpx.Response:
        headers = {"content-type": content_type}
        if gzipped:
            body, headers["content-encoding"] = gzip.compress(body), "gzip"
        return client.post(collector.url, content=body, headers=headers)

    @settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(bad=st.lists(bad_body(), min_size=1, max_size=5), order=st.randoms(use_true_random=False))
    def exchange(bad: list[tuple[str, bytes, bool]], order: random.Random) -> None:
        good = []
        for _ in range(2):
            request = llm_request(3, prompt_tokens=10, response_tokens=3, seed=next(seeds))
            as_json = order.random() < 0.5
            body = otlp_json(request) if as_json else request.SerializeToString()
            good.append(((JSON if as_json else PROTOBUF, body, order.random() < 0.3), request))
        sends = [(item, None) for item in bad] + good
        order.shuffle(sends)
        futures = [
            (pool.submit(post, clients[i % len(clients)], *item), request)
            for i, (item, request) in enumerate(sends)
        ]
        for future, request in futures:
            response = future.result()
            if request is None:
                assert response.status_code < 500, response.text
                bad_statuses[response.status_code] = bad_statuses.get(response.status_code, 0) + 1
                continue
            assert response.status_code == 200, response.text
            if response.headers["content-type"] == PROTOBUF:
                answer = ExportTraceServiceResponse.FromString(response.content)
                assert answer.partial_success.rejected_spans == 0
            valid_ids.extend(s.span_id.hex() for s in request.resource_spans[0].scope_spans[0].spans)

    try:
        exchange()
        health = clients[0].get(collector.url.replace("/v1/traces", "/health")).json()
    finally:
        for client in clients:
            client.close()
        pool.shutdown()
    assert health["status"] == "ok" and health["storage_errors"] == 0
    assert bad_statuses.get(400, 0) > 0  # the fuzzing did reach the decoders
    collector.stop()
    stored = collector.query("SELECT span_id, count(*) FROM spans GROUP BY span_id")
    counts = dict(stored)
    assert all(counts.get(span_id) == 1 for span_id in valid_ids)
