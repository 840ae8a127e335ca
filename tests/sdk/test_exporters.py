"""Stock OpenTelemetry exporters next to the SDK's own: ``tinkertrace.init(exporters=[...])``.

Every span, the LLM spans built on the export thread included, reaches a stock exporter whole and
identical to what the embedded sink stores; a failing or slow stock exporter costs the training data
nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import numpy as np
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import tinkertrace
from tinkertrace import semconv
from tinkertrace.netutil import free_ports
from tinkertrace.sdk.llm_call import LlmCall

MESSAGES = [{"role": "user", "content": "hello"}]


def _agent(server) -> None:
    @tinkertrace.traced_rollout
    def agent(task: str) -> float:
        with tinkertrace.agent_span("solver"):
            httpx.post(server.base_url + "/chat/completions", json={"model": "m", "messages": MESSAGES})
        return 1.0

    agent("q")


def _stored(traced) -> dict[str, dict]:
    return {row["span_id"]: row for row in traced.rows()}


def test_stock_exporters_get_every_span_as_stored(openai_server, trace_init, monkeypatch) -> None:
    built = []
    content = LlmCall.span_content
    monkeypatch.setattr(LlmCall, "span_content", lambda call: built.append(call) or content(call))
    memory = InMemorySpanExporter()
    traced = trace_init(exporters=[memory])
    _agent(openai_server)
    stored = _stored(traced)

    spans = {format(s.context.span_id, "016x"): s for s in memory.get_finished_spans()}
    assert spans.keys() == stored.keys() and len(spans) == 4
    assert sorted(s.attributes[semconv.SPAN_TYPE] for s in spans.values()) == [
        "agent",
        "llm",
        "reward",
        "rollout",
    ]
    (llm_id, llm), *_ = [(i, s) for i, s in spans.items() if s.attributes[semconv.SPAN_TYPE] == "llm"]
    assert (llm.name, llm.kind) == ("chat m", SpanKind.CLIENT)
    assert llm.attributes[semconv.TOKEN_SOURCE] == "server"
    ids = np.frombuffer(llm.attributes[semconv.RESPONSE_TOKEN_IDS], dtype="<i4").tolist()
    assert ids == stored[llm_id]["response_token_ids"] and ids
    assert format(llm.parent.span_id, "016x") == stored[llm_id]["parent_span_id"]
    assert len(built) == 1  # the LLM span's content is made once, for both exporters


class _Broken(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        raise RuntimeError("the viewer is down")

    def shutdown(self) -> None:
        pass


class _Stuck(SpanExporter):
    """Blocks every export until released, like an endpoint that takes minutes to time out."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.entered.set()
        self.release.wait(30)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()


def test_a_failing_or_stuck_stock_exporter_costs_the_training_data_nothing(openai_server, trace_init) -> None:
    stuck = _Stuck()
    traced = trace_init(exporters=[_Broken(), stuck], schedule_delay_s=0.01)
    try:
        _agent(openai_server)
        assert stuck.entered.wait(10)  # the stuck exporter's worker is now blocked in export
        started = time.perf_counter()
        assert tinkertrace.flush(timeout_s=1)  # the training data is flushed, the viewer waited for 1 s
        assert time.perf_counter() - started < 5
        stats = tinkertrace.stats()
        assert stats["spans_exported"] == 4 and stats["spans_dropped"] == stats["export_errors"] == 0
    finally:
        stuck.release.set()
    assert len(_stored(traced)) == 4


@pytest.mark.slow
def test_stock_otlp_exporter_to_a_collector_stores_what_the_sink_stores(
    openai_server, trace_init, tmp_path: Path
) -> None:
    """The stock OTLP/HTTP exporter (what Jaeger or Phoenix take) to the real collector next to the
    embedded sink: the same rows, token ids included."""
    from tests.sdk.test_otlp_delivery import _rows_in, _start_collector

    http_port, grpc_port = free_ports(2)
    collector = _start_collector(tmp_path / "collected", http_port, grpc_port)
    try:
        otlp = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{http_port}/v1/traces")
        traced = trace_init(exporters=[otlp])
        _agent(openai_server)
        assert tinkertrace.flush()
        stored = sorted(
            (r["span_id"], r["span_type"], r["response_token_ids"])
            for r in traced.rows(columns="span_id, span_type, response_token_ids")
        )
        collected = sorted(_rows_in(tmp_path / "collected", 4))
    finally:
        collector.terminate()
        collector.wait(timeout=30)
    assert collected == stored and len(stored) == 4


def test_the_sink_counts_batches_its_compiled_decoder_declines(tmp_path: Path) -> None:
    """A span with a link is outside the compiled decoder's subset: the reference decoder writes it
    and the sink counts the fallback (needs numba, the ``collector`` extra, as in the dev set-up)."""
    pytest.importorskip("numba")
    import duckdb
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import Link

    from tinkertrace.sdk.parquet_exporter import ParquetSpanExporter
    from tinkertrace.spanstore.reader import open_spans

    sink = ParquetSpanExporter(tmp_path / "spans")
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(sink))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("plain") as plain:
        pass
    assert sink.stats.conversion_fallbacks == 0
    with tracer.start_as_current_span("linked", links=[Link(plain.get_span_context())]):
        pass
    provider.shutdown()
    assert sink.stats.conversion_fallbacks == 1
    assert sink.stats.spans_exported == 2
    con = duckdb.connect()
    open_spans(con, tmp_path / "spans")
    assert con.sql("SELECT name FROM spans ORDER BY name").fetchall() == [("linked",), ("plain",)]
