"""A rollout the endpoint serves: its identity, its root span's ids, and the record the journal keeps.

The root span of a rollout driven over HTTP is not an open OpenTelemetry span held in memory: its ids
and start time are taken when its first call arrives (:meth:`ServedRollout.open`), kept in the journal
(:meth:`ServedRollout.record`, so that a rollout opened before a restart is the same rollout after it:
:meth:`ServedRollout.from_record`), and the finished span is made at its end
(:meth:`ServedRollout.end_span`), as ``@traced_rollout`` makes it: status, counts of LLM and reward
spans. A rollout whose first call came with a W3C ``traceparent`` (``caller_driven``: an agent using
the SDK writes its own rollout span) gets no root span from the endpoint.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.util.types import AttributeValue

from tinkertrace import semconv
from tinkertrace.sdk.context import RolloutState
from tinkertrace.sdk.runtime import Runtime
from tinkertrace.sdk.spans import child_span_context
from tinkertrace.serving.rollout_routing import CallIdentity
from tinkertrace.serving.served_calls import ServedAnswers


def _context(trace_id: int, span_id: int) -> SpanContext:
    return SpanContext(trace_id, span_id, False, TraceFlags(TraceFlags.SAMPLED))


@dataclass(frozen=True)
class FinishedRollout:
    """How a rollout ended: its status and attempt (a call naming a higher attempt reopens it)."""

    status: str
    attempt: int


@dataclass
class ServedRollout:
    """A rollout seen by the endpoint: the SDK's rollout state (counts; ``state.span`` stands for its
    root span as the parent of its calls; ``state.rollout_id`` the id it is recorded under) and what
    its root span needs at the end. ``key``: the rollout id the agent names it by."""

    key: str
    state: RolloutState
    agent_name: str | None
    parent: SpanContext | None
    start_ns: int
    caller_driven: bool
    last_seen: float = field(default_factory=time.monotonic)
    answers: ServedAnswers = field(default_factory=ServedAnswers)  # response ids a reward may name

    @classmethod
    def open(cls, rt: Runtime, identity: CallIdentity, stored_id: str) -> ServedRollout:
        """A new rollout of ``identity`` (its id set), recorded as ``stored_id``, its root span under the
        current span (if any)."""
        assert identity.rollout_id is not None
        parent, own = child_span_context(rt)
        state = RolloutState(
            stored_id,
            identity.task_id or identity.rollout_id,
            identity.attempt,
            identity.split,
            trace.NonRecordingSpan(own),
        )
        caller_driven = parent is not None
        return cls(identity.rollout_id, state, identity.agent_name, parent, time.time_ns(), caller_driven)

    @property
    def context(self) -> SpanContext:
        return self.state.span.get_span_context()

    def record(self) -> dict[str, Any]:
        """The journal's record of this open rollout (the journal adds the counts of stored spans)."""
        state = self.state
        return {
            "id": state.rollout_id,
            "key": self.key,
            "task_id": state.task_id,
            "attempt": state.attempt,
            "split": state.split,
            "agent": self.agent_name,
            "trace_id": f"{self.context.trace_id:032x}",
            "span_id": f"{self.context.span_id:016x}",
            "parent_span_id": f"{self.parent.span_id:016x}" if self.parent else None,
            "start_ns": self.start_ns,
            "caller_driven": self.caller_driven,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> ServedRollout:
        """The open rollout the journal kept (its counts: the spans it stored)."""
        trace_id = int(record["trace_id"], 16)
        parent = record.get("parent_span_id")
        state = RolloutState(
            record["id"],
            record["task_id"],
            record["attempt"],
            record["split"],
            trace.NonRecordingSpan(_context(trace_id, int(record["span_id"], 16))),
            llm_calls=record.get("llm_calls", 0),
            rewards=record.get("rewards", 0),
            agent_spans=record.get("agent_spans", 0),
        )
        rollout = cls(
            record.get("key", record["id"]),
            state,
            record.get("agent"),
            _context(trace_id, int(parent, 16)) if parent else None,
            record["start_ns"],
            caller_driven=record.get("caller_driven", False),
        )
        rollout.answers.ids.update(record.get("answers", ()))  # the answers it gave before the restart
        return rollout

    def closed_record(self, status: str | None) -> dict[str, Any]:
        """The journal's record of its end: finished with ``status``, or forgotten (``None``)."""
        return {"id": self.state.rollout_id, "key": self.key, "status": status, "attempt": self.state.attempt}

    def end_span(self, rt: Runtime, status: str) -> ReadableSpan:
        """The finished root span, with ``status`` and the counts (for ``rt.processor.on_end``)."""
        state = self.state
        attributes: dict[str, AttributeValue] = {
            semconv.SPAN_TYPE: semconv.TYPE_ROLLOUT,
            semconv.ROLLOUT_ID: state.rollout_id,
            semconv.TASK_ID: state.task_id,
            semconv.ATTEMPT: state.attempt,
            semconv.SPLIT: state.split,
            semconv.ROLLOUT_STATUS: status,
            semconv.ROLLOUT_LLM_CALLS: state.llm_calls,
            semconv.ROLLOUT_REWARDS: state.rewards,
            semconv.ROLLOUT_AGENT_SPANS: state.agent_spans,
        }
        ok = status == semconv.STATUS_SUCCEEDED
        return ReadableSpan(
            f"rollout {self.agent_name or 'served'}",
            context=self.context,
            parent=self.parent,
            resource=rt.provider.resource,
            attributes=attributes,
            kind=SpanKind.INTERNAL,
            status=Status(StatusCode.OK if ok else StatusCode.ERROR),
            start_time=self.start_ns,
            end_time=time.time_ns(),
            instrumentation_scope=rt.scope,
        )
