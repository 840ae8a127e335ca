"""Starting the SDK's spans with the rollout and agent in context stamped on in one step.

Every span tinkertrace starts goes through :func:`start_span` (LLM spans, which are built on the
export thread, through :func:`context_attributes`): the rollout id, task id, attempt,
split and agent name are merged into the start attributes (one attribute check, no extra span
processor), and the rollout's LLM, reward and agent spans are counted for its root span.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import Span, SpanKind

from tinkertrace import semconv
from tinkertrace.sdk.context import AGENT, ROLLOUT
from tinkertrace.sdk.runtime import Runtime

_COUNTED = {semconv.TYPE_LLM: "llm_calls", semconv.TYPE_REWARD: "rewards", semconv.TYPE_AGENT: "agent_spans"}


def context_attributes(span_type: str) -> dict[str, Any]:
    """The span type plus the rollout and agent in context; counts the span for its rollout."""
    attrs: dict[str, Any] = {semconv.SPAN_TYPE: span_type}
    state = ROLLOUT.get()
    if state is not None and span_type != semconv.TYPE_ROLLOUT:
        attrs[semconv.ROLLOUT_ID] = state.rollout_id
        attrs[semconv.TASK_ID] = state.task_id
        attrs[semconv.ATTEMPT] = state.attempt
        attrs[semconv.SPLIT] = state.split
        counted = _COUNTED.get(span_type)
        if counted:
            state.count(counted)
    if (agent := AGENT.get()) is not None:
        attrs[semconv.AGENT_NAME] = agent.name
        attrs[semconv.AGENT_SPAN_ID] = agent.span_id
    return attrs


def start_span(
    rt: Runtime,
    name: str,
    span_type: str,
    attributes: dict[str, Any] | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
) -> Span:
    """Start a span of ``span_type`` carrying ``attributes`` plus the rollout and agent in context.

    Rollout ids go on every span but the rollout's own root; the enclosing agent span's name and id
    on every span inside one (a span's own ``attributes`` win).
    """
    attrs = context_attributes(span_type)
    if attributes:
        attrs.update(attributes)
    return rt.tracer.start_span(name, kind=kind, attributes=attrs)
