"""Realistic OTLP requests of LLM-call spans, for tests and benchmarks (no SDK needed)."""

from __future__ import annotations

import numpy as np
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from tinkertrace import semconv
from tinkertrace.packing import pack_ids, pack_logprobs


def _set(kv: KeyValue, value: str | int | float | bytes | list[int]) -> None:
    if isinstance(value, bytes):
        kv.value.bytes_value = value
    elif isinstance(value, bool):
        kv.value.bool_value = value
    elif isinstance(value, int):
        kv.value.int_value = value
    elif isinstance(value, float):
        kv.value.double_value = value
    elif isinstance(value, list):
        for item in value:
            kv.value.array_value.values.add().int_value = item
    else:
        kv.value.string_value = value


def llm_request(
    n_spans: int = 100,
    *,
    prompt_tokens: int = 300,
    response_tokens: int = 100,
    packed: bool = True,
    seed: int = 0,
    service: str = "agent",
    spread: float = 0.0,
) -> ExportTraceServiceRequest:
    """``n_spans`` LLM spans (10 per rollout, one trace per rollout) with token ids and logprobs.

    With ``spread`` each span's token counts are drawn uniformly within ±``spread`` of the given ones
    (and its usage attributes say so), as real spans differ; 0 gives every span the same counts."""
    rng = np.random.default_rng(seed)
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    _set(resource_spans.resource.attributes.add(key="service.name"), service)
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.name = "tinkertrace"
    base_ns = 1_767_225_600_000_000_000 + seed * 1_000_000_000
    for i in range(n_spans):
        rollout = i // 10
        span = scope_spans.spans.add()
        span.trace_id = _trace_id(seed, rollout)
        span.span_id = rng.integers(1, 2**63, dtype=np.int64).item().to_bytes(8, "big")
        span.parent_span_id = _trace_id(seed, rollout)[:8]
        span.name = "chat tiny"
        span.kind = 3  # CLIENT
        span.start_time_unix_nano = base_ns + i * 1_000_000
        span.end_time_unix_nano = span.start_time_unix_nano + 500_000
        n_prompt, n_response = (
            int(rng.integers(round(n * (1 - spread)), round(n * (1 + spread)) + 1)) if spread else n
            for n in (prompt_tokens, response_tokens)
        )
        prompt = rng.integers(0, 50_000, n_prompt, dtype=np.int32)
        response = rng.integers(0, 50_000, n_response, dtype=np.int32)
        logprobs = -rng.random(n_response, dtype=np.float32)
        attributes: dict[str, str | int | float | bytes | list[int]] = {
            semconv.SPAN_TYPE: semconv.TYPE_LLM,
            semconv.ROLLOUT_ID: f"rollout-{seed}-{rollout}",
            semconv.TASK_ID: f"task-{rollout % 7}",
            semconv.ATTEMPT: 0,
            semconv.SPLIT: "train",
            semconv.AGENT_NAME: "solver",
            semconv.GENAI_OPERATION: "chat",
            semconv.GENAI_PROVIDER: "openai",
            semconv.GENAI_REQUEST_MODEL: "tinkertrace/tiny-chat",
            semconv.GENAI_RESPONSE_ID: f"resp-{seed}-{i}",
            semconv.GENAI_INPUT_TOKENS: n_prompt,
            semconv.GENAI_OUTPUT_TOKENS: n_response,
            semconv.TOKEN_SOURCE: semconv.SOURCE_SERVER,
            semconv.POLICY_VERSION: 3,
        }
        if packed:
            attributes[semconv.TOKEN_ENCODING] = semconv.ENCODING_PACKED
            attributes[semconv.PROMPT_TOKEN_IDS] = pack_ids(prompt)
            attributes[semconv.RESPONSE_TOKEN_IDS] = pack_ids(response)
            attributes[semconv.RESPONSE_LOGPROBS] = pack_logprobs(logprobs)
        else:
            attributes[semconv.TOKEN_ENCODING] = semconv.ENCODING_ARRAY
            attributes[semconv.PROMPT_TOKEN_IDS] = prompt.tolist()
            attributes[semconv.RESPONSE_TOKEN_IDS] = response.tolist()
            kv = span.attributes.add(key=semconv.RESPONSE_LOGPROBS)
            for value in logprobs.tolist():
                kv.value.array_value.values.add().double_value = value
        for key, value in attributes.items():
            _set(span.attributes.add(key=key), value)
        event = span.events.add(name="gen_ai.choice", time_unix_nano=span.end_time_unix_nano)
        _set(event.attributes.add(key="index"), 0)
    return request


def _trace_id(seed: int, rollout: int) -> bytes:
    return (seed + 1).to_bytes(8, "big") + (rollout + 1).to_bytes(8, "big")
