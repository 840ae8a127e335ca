"""An ended LLM call as bytes, and back: what the endpoint's journal logs for a call.

Building an LLM span's content (the response parsed, token ids packed, messages as JSON) costs about
0.5–1.2 ms of CPU per call on a loaded 2-core machine; logging the call's own bytes costs a few
microseconds. So the journal logs :func:`call_record` before the answer leaves and the span is built
after: live, from the call still in memory; after a crash, from the record (:func:`restored_span`).
Both run the same :meth:`~tinkertrace.sdk.llm_call.LlmCall.span_content` (of a
:class:`~tinkertrace.serving.served_calls.ServedCall`), so a replayed span is the
span the live path would have written.

A record is ``<u32 header length><u32 request length>`` + the header (JSON: ids, times, status,
the response headers the parser reads, events, the attributes taken at the call's start) + the
agent's request body + the response body as received.
"""

from __future__ import annotations

import struct
from typing import Any

import httpx
import orjson
from opentelemetry.sdk.trace import Event
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from tinkertrace import semconv
from tinkertrace.sdk.llm_call import LlmCall
from tinkertrace.sdk.runtime import Runtime
from tinkertrace.sdk.spans import DeferredSpan
from tinkertrace.serving.served_calls import ServedCall

_HEAD = struct.Struct("<II")
_READ_HEADERS = ("content-type", "content-encoding", semconv.HEADER_POLICY_VERSION)  # what parsing reads


def call_record(span: DeferredSpan) -> bytes:
    """The record of the ended call behind ``span`` (an LLM span: ``span.source`` is its call)."""
    call: LlmCall = span.source
    context, parent = span.get_span_context(), span.parent
    assert context is not None
    head = {
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "flags": int(context.trace_flags),
        "parent": [f"{parent.span_id:016x}", parent.is_remote] if parent is not None else None,
        "start_ns": span.start_time,
        "end_ns": span.end_time,
        "kind": call.kind,
        "url": str(call.url),
        "injected": call.injected,
        "status": call.status,
        "headers": {k: v for k in _READ_HEADERS if (v := call.headers.get(k)) is not None},
        "closed_early": call.closed_early,
        "errors": call.error_attributes,
        "events": [[e.name, dict(e.attributes or {}), e.timestamp] for e in call.events],
        "span_status": [call.span_status.status_code.name, call.span_status.description],
        "attributes": call.span.context_attributes,
    }
    encoded = orjson.dumps(head)
    return _HEAD.pack(len(encoded), len(call.raw)) + encoded + call.raw + call.response_bytes()


def restored_span(rt: Runtime, data: bytes) -> DeferredSpan:
    """The LLM span of a call record, its content built (when read) as the live call's would be."""
    head_size, request_size = _HEAD.unpack_from(data)
    head = orjson.loads(data[_HEAD.size : _HEAD.size + head_size])
    raw = data[_HEAD.size + head_size : _HEAD.size + head_size + request_size]
    call = ServedCall(rt, head["kind"], httpx.URL(head["url"]), orjson.loads(raw), raw, None)
    call.injected, call.status, call.headers = head["injected"], head["status"], head["headers"]
    call.restore_ended(data[_HEAD.size + head_size + request_size :], head["closed_early"])
    call.error_attributes = head["errors"]
    call.events = [
        Event(name, _tuples(attributes), timestamp) for name, attributes, timestamp in head["events"]
    ]
    code, description = head["span_status"]
    call.span_status = Status(StatusCode[code], description)
    call.span.context_attributes = head["attributes"]
    trace_id, flags = int(head["trace_id"], 16), TraceFlags(head["flags"])
    parent = head["parent"]
    return DeferredSpan(
        call.span_content,
        context=SpanContext(trace_id, int(head["span_id"], 16), False, flags),
        parent=SpanContext(trace_id, int(parent[0], 16), parent[1], flags) if parent else None,
        resource=rt.provider.resource,
        kind=SpanKind.CLIENT,
        start_time=head["start_ns"],
        end_time=head["end_ns"],
        instrumentation_scope=rt.scope,
        source=call,
    )


def _tuples(attributes: dict[str, Any]) -> dict[str, Any]:
    """Attribute values as OpenTelemetry keeps them (sequences as tuples; JSON gave lists)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in attributes.items()}
