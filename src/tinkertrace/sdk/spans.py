"""Making the SDK's spans, with the rollout and agent in context stamped on in one step.

Rollout, agent and reward spans are started with :func:`start_span`; an LLM call's span is made by
:class:`LlmSpan`. Either way the rollout id, task id, attempt, split and agent name are merged into
the start attributes (one attribute check, no extra span processor), and the rollout's LLM, reward
and agent spans are counted for its root span.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Span, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from tinkertrace import semconv
from tinkertrace.sdk.context import AGENT, ROLLOUT
from tinkertrace.sdk.runtime import Runtime

log = logging.getLogger("tinkertrace")

# span type -> the RolloutState count it adds to (the root span reports them)
COUNTED = {semconv.TYPE_LLM: "llm_calls", semconv.TYPE_REWARD: "rewards", semconv.TYPE_AGENT: "agent_spans"}

# what a deferred span computes: name, attributes, events, status
SpanContent = tuple[str, dict[str, Any], tuple[Event, ...], Status]


def context_attributes(span_type: str) -> dict[str, Any]:
    """The span type plus the rollout and agent in context; counts the span for its rollout."""
    attrs: dict[str, Any] = {semconv.SPAN_TYPE: span_type}
    state = ROLLOUT.get()
    if state is not None and span_type != semconv.TYPE_ROLLOUT:
        attrs[semconv.ROLLOUT_ID] = state.rollout_id
        attrs[semconv.TASK_ID] = state.task_id
        attrs[semconv.ATTEMPT] = state.attempt
        attrs[semconv.SPLIT] = state.split
        counted = COUNTED.get(span_type)
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


class DeferredSpan(ReadableSpan):
    """A finished span whose name, attributes, events and status are made by ``content()`` the first
    time any of them is read: by the first exporter, on its worker thread, not by the agent's thread
    that ended the span. Every reader (the OTLP encoder, ``to_json``, a stock exporter) sees a whole
    span; ``content()`` runs once."""

    _DEFERRED = ("_name", "_attributes", "_events", "_status")

    def __init__(
        self,
        content: Callable[[], SpanContent],
        *,
        context: SpanContext,
        parent: SpanContext | None,
        resource: Resource,
        kind: SpanKind,
        start_time: int,
        end_time: int,
        instrumentation_scope: InstrumentationScope,
        source: Any = None,
    ) -> None:
        # ``ReadableSpan.__init__`` would set the deferred fields too: its other fields are set here
        # (on the agent's thread: 0.8 µs instead of 1.8 µs here)
        self._context, self._parent, self._resource, self._kind = context, parent, resource, kind
        self._start_time, self._end_time, self._links = start_time, end_time, ()
        self._instrumentation_scope, self._instrumentation_info = instrumentation_scope, None
        self._content = content
        self._content_lock = threading.Lock()
        self.source = source  # what the content is made from (an LLM call), for a reader that logs it

    def __getattr__(self, name: str) -> Any:  # only called for what is not set yet
        if name not in DeferredSpan._DEFERRED:
            raise AttributeError(name)
        with self._content_lock:
            if name not in self.__dict__:
                self._fill()
        return self.__dict__[name]

    def _fill(self) -> None:
        try:
            content = self._content()
        except Exception as exc:  # the span is kept, saying what went wrong
            log.exception("tinkertrace: building the content of a span failed")
            error = f"{type(exc).__name__}: {exc}"
            content = ("unknown", {semconv.LLM_CAPTURE_ERROR: error}, (), Status(StatusCode.ERROR, error))
        self._name, self._attributes, self._events, self._status = content
        del self._content  # what it held (request and response bytes) is no longer needed


class LlmSpan:
    """The span of one LLM call, made without an OTel ``Span`` object.

    The call is a leaf (nothing runs inside it), so the agent's thread only takes its ids under the
    current span, the rollout and agent in context and the start time; :meth:`end` hands a
    :class:`DeferredSpan` to the span processors, and its content (request parameters, messages, the
    parsed response, packed token ids) is built on the export thread.
    """

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.parent, self.context = child_span_context(rt)
        self.context_attributes = context_attributes(semconv.TYPE_LLM)
        self.start_ns = time.time_ns()

    def end(self, end_ns: int, content: Callable[[], SpanContent], source: Any = None) -> None:
        """End the span at ``end_ns``; ``content()`` runs later and must read only settled data (that of
        ``source``)."""
        span = DeferredSpan(
            content,
            source=source,
            context=self.context,
            parent=self.parent,
            resource=self.rt.provider.resource,
            kind=SpanKind.CLIENT,
            start_time=self.start_ns,
            end_time=end_ns,
            instrumentation_scope=self.rt.scope,
        )
        self.rt.processor.on_end(span)


def child_span_context(rt: Runtime) -> tuple[SpanContext | None, SpanContext]:
    """``(parent, own)`` span contexts of a new span under the current span, as OTel would make them."""
    parent = trace.get_current_span().get_span_context()
    ids = rt.provider.id_generator
    if parent.is_valid:
        flags = TraceFlags(parent.trace_flags | TraceFlags.SAMPLED)
        own = SpanContext(parent.trace_id, ids.generate_span_id(), False, flags, parent.trace_state)
        return parent, own
    flags = TraceFlags(TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID)
    return None, SpanContext(ids.generate_trace_id(), ids.generate_span_id(), False, flags)


def exception_event(exc: BaseException) -> Event:
    """The ``exception`` event OTel's ``record_exception`` would add."""
    module, qualname = type(exc).__module__, type(exc).__qualname__
    return Event(
        "exception",
        {
            "exception.type": f"{module}.{qualname}" if module and module != "builtins" else qualname,
            "exception.message": str(exc),
            "exception.stacktrace": "".join(traceback.format_exception(exc)),
            "exception.escaped": "False",
        },
    )
