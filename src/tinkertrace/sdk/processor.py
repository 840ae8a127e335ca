"""A SpanProcessor that stamps the rollout and agent in context onto every span at start."""

from __future__ import annotations

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from tinkertrace import semconv
from tinkertrace.sdk.context import AGENT, ROLLOUT

_COUNTED = {semconv.TYPE_LLM: "llm_calls", semconv.TYPE_REWARD: "rewards", semconv.TYPE_AGENT: "agent_spans"}


class ContextAttributesProcessor(SpanProcessor):
    """Copies rollout id, task id, attempt, split and agent name onto each span, and counts the
    rollout's LLM, reward and agent spans for its root span."""

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        state = ROLLOUT.get()
        span_type = str((span.attributes or {}).get(semconv.SPAN_TYPE))
        if state is not None and span_type != semconv.TYPE_ROLLOUT:
            span.set_attributes(
                {
                    semconv.ROLLOUT_ID: state.rollout_id,
                    semconv.TASK_ID: state.task_id,
                    semconv.ATTEMPT: state.attempt,
                    semconv.SPLIT: state.split,
                }
            )
            counted = _COUNTED.get(span_type)
            if counted:
                state.count(counted)
        agent = AGENT.get()
        if agent is not None and semconv.AGENT_NAME not in (span.attributes or {}):
            span.set_attribute(semconv.AGENT_NAME, agent)

    def on_end(self, span: ReadableSpan) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
