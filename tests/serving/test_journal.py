"""The endpoint's journal: replay after a crash stores each span once; rollouts outlive a restart.

Real servers on loopback ports (the scripted sampler stands in for the model), the real OpenAI client,
the journal's real write-ahead log and Parquet files read back with DuckDB.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import duckdb
import httpx
import openai
import orjson
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.trace import SpanContext, TraceFlags

from tinkertrace import semconv
from tinkertrace.collector.wal import WriteAheadLog, segment_ids
from tinkertrace.netutil import BackgroundServer
from tinkertrace.sdk.export import encode_batch
from tinkertrace.sdk.runtime import private_runtime
from tinkertrace.serving.call_records import call_record, restored_span
from tinkertrace.serving.journal import ROLLOUTS, SPANS, Journal
from tinkertrace.serving.journal_delivery import JournalStats
from tinkertrace.serving.journal_targets import ParquetTarget
from tinkertrace.serving.policy import PolicyHolder
from tinkertrace.serving.recording import CallRecorder
from tinkertrace.serving.served_calls import ServedCall
from tinkertrace.spanstore.reader import open_spans

MODEL = "scripted-model"


def _query(spans: Path, sql: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect()
    open_spans(con, spans)
    return con.execute(sql).fetchall()


def _llm_span_payload(span_id: int, rollout_id: str) -> bytes:
    span = ReadableSpan(
        "chat m",
        context=SpanContext(0xABC, span_id, False, TraceFlags(TraceFlags.SAMPLED)),
        resource=Resource.create({"service.name": "t"}),
        attributes={semconv.SPAN_TYPE: semconv.TYPE_LLM, semconv.ROLLOUT_ID: rollout_id},
        start_time=time.time_ns(),
        end_time=time.time_ns(),
    )
    request = encode_batch([span], JournalStats())
    assert request is not None
    return request.SerializeToString()


def test_a_segment_delivered_before_a_crash_is_replayed_into_parquet_exactly_once(tmp_path: Path) -> None:
    """The kill between delivery and the segment's deletion: its Parquet files are already written; the
    replay replaces them (not adds to them), and the rollout state logged with it comes back."""
    spans, folder = tmp_path / "spans", tmp_path / "spans" / "_journal" / "t"
    payloads, logged = [_llm_span_payload(i, "r-1") for i in (0x1234, 0x5678)], time.time_ns()
    wal = WriteAheadLog(folder)
    segment = wal.open_segment()
    opened = {"id": "r-1", "task_id": "t", "attempt": 0, "split": "train", "llm_calls": 2, "start_ns": 1}
    wal.append(ROLLOUTS + orjson.dumps([opened, {"id": "r-0", "status": "failed"}]), logged)
    for payload in payloads:
        wal.append(SPANS + payload, logged)
    wal.sync()
    wal.close_segment()
    delivered = ParquetTarget(spans, "t", JournalStats())  # what the run did before it was killed:
    delivered.begin(segment)
    for payload in payloads:  # each span in a file of its own (a replay writes one file)
        delivered.deliver(payload, logged)
        delivered.writer.flush()
    delivered.end(segment)
    assert _query(spans, "SELECT count(*), count(DISTINCT filename) FROM spans") == [(2, 2)]

    stats = JournalStats()
    journal = Journal(folder, [ParquetTarget(spans, "t", stats)], stats)
    restored = journal.recover(private_runtime(sink=journal, spans_dir=spans))
    journal.start()
    journal.shutdown()
    rows = _query(spans, "SELECT span_id, rollout_id FROM spans ORDER BY 1")
    assert rows == [(f"{0x1234:016x}", "r-1"), (f"{0x5678:016x}", "r-1")]
    assert restored == {"r-1": opened, "r-0": {"id": "r-0", "status": "failed"}}
    assert stats.spans_replayed == 2 and segment not in segment_ids(folder)


def _served(
    start_server: Callable[..., BackgroundServer], policy: PolicyHolder, spans: Path
) -> tuple[BackgroundServer, CallRecorder]:
    recorder = CallRecorder(spans_dir=spans)
    return start_server(policy, recorder=recorder), recorder


def test_an_open_rollout_is_rewarded_and_finished_after_a_restart_and_stays_finished(
    tokenizer: Any, scripted: Any, start_server: Callable[..., BackgroundServer], tmp_path: Path
) -> None:
    spans = tmp_path / "spans"
    policy = PolicyHolder(scripted(["before", "after"]), tokenizer, MODEL)
    server, recorder = _served(start_server, policy, spans)
    client = openai.OpenAI(base_url=f"{server.url}/rollouts/r-9/task/t-9/v1", api_key="x", max_retries=0)
    first = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert httpx.post(f"{server.url}/v1/rollouts/r-9/reward", json={"value": 0.5}).status_code == 200
    server.stop()  # the endpoint restarts on the same folder

    server, recorder = _served(start_server, policy, spans)
    assert recorder.stats()["open_rollouts"] == 1
    client = openai.OpenAI(base_url=f"{server.url}/rollouts/r-9/task/t-9/v1", api_key="x", max_retries=0)
    second = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "again"}])
    earlier = httpx.post(f"{server.url}/v1/rollouts/r-9/reward", json={"value": 0.2, "response_id": first.id})
    assert earlier.status_code == 200, earlier.text  # an answer given before the restart may be named
    reward = httpx.post(f"{server.url}/v1/rollouts/r-9/reward", json={"value": 1.0, "response_id": second.id})
    assert reward.json()["rewards"] == 3  # the count carried over the restart
    done = httpx.post(f"{server.url}/v1/rollouts/r-9/finish")
    assert done.json() == {"rollout_id": "r-9", "status": "succeeded", "llm_calls": 2, "rewards": 3}
    server.stop()

    server, recorder = _served(start_server, policy, spans)  # a finished rollout stays finished
    assert recorder.finished_status("r-9") == semconv.STATUS_SUCCEEDED
    again = httpx.post(f"{server.url}/v1/rollouts/r-9/finish")
    assert again.status_code == 409 and "succeeded" in again.json()["error"]["message"]
    assert recorder.flush()
    rows = _query(
        spans,
        "SELECT span_type, count(DISTINCT span_id), count(DISTINCT trace_id), min(task_id) FROM spans "
        "GROUP BY 1 ORDER BY 1",
    )
    assert rows == [("llm", 2, 1, "t-9"), ("reward", 3, 1, "t-9"), ("rollout", 1, 1, "t-9")]
    [(parent,)] = _query(spans, f"SELECT DISTINCT parent_span_id FROM spans WHERE response_id = '{first.id}'")
    assert _query(spans, "SELECT span_id FROM spans WHERE span_type = 'rollout'") == [(parent,)]


class _Kept(SpanProcessor):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


def test_a_call_record_rebuilds_the_span_the_live_call_builds(tmp_path: Path) -> None:
    """What the journal logs for a call (its own bytes) gives, replayed, the span built live: name,
    ids, times, every attribute (token ids, messages, rollout), events and status."""
    kept = _Kept()
    rt = private_runtime(sink=kept, spans_dir=tmp_path)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    answer = {
        "id": "chatcmpl-7",
        "model": "m",
        "policy_version": 3,
        "prompt_token_ids": [1, 2, 3],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
                "token_ids": [7, 8],
                "logprobs": {"content": [{"token": "o", "logprob": -0.5}, {"token": "k", "logprob": -0.25}]},
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }
    for status, response in ((200, orjson.dumps(answer)), (400, b'{"error": {"message": "too long"}}')):
        call = ServedCall(  # as the endpoint makes it
            rt, "chat", httpx.URL("http://127.0.0.1:9/v1/chat/completions"), body, orjson.dumps(body), None
        )
        call.span.context_attributes[semconv.ROLLOUT_ID] = "r-1"
        call.extended_body()
        call.status, call.headers = status, {"content-type": "application/json"}
        if status == 400:
            call.drop_injection()
            call.judge_refusal(400)
        call.feed(response)
        call.finish()
    for live in kept.spans:
        replayed = restored_span(rt, call_record(live))
        assert (replayed.name, replayed.context, replayed.parent) == (live.name, live.context, live.parent)
        assert (replayed.start_time, replayed.end_time, replayed.kind) == (
            live.start_time,
            live.end_time,
            live.kind,
        )
        assert dict(replayed.attributes or {}) == dict(live.attributes or {})
        assert [(e.name, dict(e.attributes or {})) for e in replayed.events] == [
            (e.name, dict(e.attributes or {})) for e in live.events
        ]
        assert (replayed.status.status_code, replayed.status.description) == (
            live.status.status_code,
            live.status.description,
        )
    assert kept.spans[0].attributes[semconv.GENAI_RESPONSE_ID] == "chatcmpl-7"
    assert kept.spans[1].status.status_code.name == "ERROR" and kept.spans[1].events


def test_concurrent_calls_share_their_fsyncs(
    tokenizer: Any, scripted: Any, start_server: Callable[..., BackgroundServer], tmp_path: Path
) -> None:
    """Group commit: calls answered together are made durable by one fsync, not one each."""
    policy = PolicyHolder(scripted(["same reply"]), tokenizer, MODEL)
    server, recorder = _served(start_server, policy, tmp_path / "spans")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)

    def call(_: int) -> str:
        return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}]).id

    with ThreadPoolExecutor(16) as pool:
        answered = set(pool.map(call, range(64)))
    stats = recorder.stats()
    assert len(answered) == 64 and stats["spans_logged"] == 64
    assert stats["journal_commits"] < 64, stats
    assert recorder.flush()
    assert _query(tmp_path / "spans", "SELECT count(DISTINCT response_id) FROM spans") == [(64,)]


def test_a_stream_ends_only_once_its_call_is_stored(
    tokenizer: Any, scripted: Any, start_server: Callable[..., BackgroundServer], tmp_path: Path
) -> None:
    """The client stops reading at ``data: [DONE]``: that last chunk waits for the journal, so a crash
    before the call is stored never leaves a client holding a whole answer (seen lost: 1 of 120 calls
    in the kill -9 test while the end was sent first)."""
    policy = PolicyHolder(scripted(["a streamed reply"]), tokenizer, MODEL)
    server, recorder = _served(start_server, policy, tmp_path / "spans")
    release = threading.Event()
    stored = recorder.stored

    async def held(durable: Any) -> None:
        while not release.is_set():
            await asyncio.sleep(0.01)
        await stored(durable)

    recorder.stored = held  # type: ignore[method-assign]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    seen: list[bytes] = []
    with httpx.Client(timeout=30) as client:

        def read() -> None:
            with client.stream("POST", f"{server.url}/rollouts/s-1/v1/chat/completions", json=body) as r:
                seen.extend(r.iter_raw())

        with ThreadPoolExecutor(1) as pool:
            reading = pool.submit(read)
            deadline = time.monotonic() + 30
            while b'"finish_reason":"stop"' not in b"".join(seen) and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.3)  # the end would have arrived by now if it were not held
            assert b"[DONE]" not in b"".join(seen)
            release.set()
            reading.result(timeout=30)
    assert b"".join(seen).rstrip().endswith(b"data: [DONE]")
