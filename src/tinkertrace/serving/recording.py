"""The endpoint records what it serves: every LLM call it answers as an LLM span of the SDK's contract.

A :class:`CallRecorder` holds a runtime of its own (:func:`tinkertrace.sdk.runtime.private_runtime`:
the SDK's exporters, batch processors and OTLP spool, so a collector that is down loses nothing), and
makes each span with the SDK's own :class:`~tinkertrace.sdk.llm_call.LlmCall`: the request body and
the response bytes go in, the span content (messages, packed token ids, logprobs, policy version,
finish reasons) is built on the export thread exactly as for a call the SDK captured in an agent. Every
such span says ``tinkertrace.llm.capture_side = server``.

Which rollout a call belongs to comes from the request (:mod:`.rollout_routing`): the headers
``x-tinkertrace-rollout-id`` / ``-task-id`` / ``-attempt`` / ``-split`` / ``-agent-name`` (a URL
prefix ``/rollouts/{id}/...`` sets the same), and W3C ``traceparent`` makes the span a child of the
caller's span. The first call of a rollout id starts its rollout span (held open in memory); rewards
posted over HTTP become reward spans of the SDK's form, and ``finish`` ends the rollout span with its
status and the counts of LLM and reward spans, as ``@traced_rollout`` does. A rollout driven by the
SDK in the agent (which writes its own rollout span) is never finished here: its open state is
forgotten after ``rollout_idle_s`` without calls. Files in a spans folder are closed (made readable)
every ``roll_s`` seconds, as a collector rolls its files.

A reward naming a ``response_id`` must name an answer of that rollout (:mod:`.served_calls`); a call
under a finished rollout id is a 409 unless it names a higher attempt, which reopens the rollout,
recorded as ``{id}/attempt/{n}``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanContext, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tinkertrace import semconv
from tinkertrace.sdk import runtime as sdk_runtime
from tinkertrace.sdk.context import ROLLOUT, RolloutState
from tinkertrace.sdk.llm_call import LlmCall
from tinkertrace.sdk.rewards import reward_attributes
from tinkertrace.sdk.spans import start_span
from tinkertrace.serving.openai_wire.errors import ApiError, read_json, require_object
from tinkertrace.serving.rollout_routing import CallIdentity
from tinkertrace.serving.served_calls import ServedAnswers, ServedCall

Handler = Callable[[Request], Awaitable[Response]]
ROLLOUT_STATUSES = (semconv.STATUS_SUCCEEDED, semconv.STATUS_FAILED)
_PROPAGATOR = TraceContextTextMapPropagator()


def caller_span(headers: Mapping[str, str]) -> SpanContext | None:
    """The caller's span named by a W3C ``traceparent`` header, or None (absent or malformed)."""
    if "traceparent" not in headers:
        return None
    parent = trace.get_current_span(_PROPAGATOR.extract(headers)).get_span_context()
    return parent if parent.is_valid else None


@dataclass
class ServedRollout:
    """A rollout seen by the endpoint: the SDK's rollout state (counts) and its open root span."""

    state: RolloutState
    agent_name: str | None
    last_seen: float = field(default_factory=time.monotonic)
    answers: ServedAnswers = field(default_factory=ServedAnswers)  # response ids a reward may name


@dataclass(frozen=True)
class FinishedRollout:
    """How a rollout ended: its status and attempt (a call naming a higher attempt reopens it)."""

    status: str
    attempt: int


@contextmanager
def _inside(rollout: ServedRollout | None, parent: SpanContext | None) -> Iterator[None]:
    """The SDK's context for spans of ``rollout``: its state in ``ROLLOUT``, the parent span current."""
    span: Span | None = trace.NonRecordingSpan(parent) if parent is not None else None
    if span is None and rollout is not None:
        span = rollout.state.span
    token = otel_context.attach(trace.set_span_in_context(span) if span else otel_context.Context())
    rollout_token = ROLLOUT.set(rollout.state if rollout else None)
    try:
        yield
    finally:
        ROLLOUT.reset(rollout_token)
        otel_context.detach(token)


class CallRecorder:
    """Records calls, rewards and rollout ends as spans (see the module docstring)."""

    def __init__(
        self,
        *,
        collector: str | None = None,
        spans_dir: str | Path | None = None,
        spool_dir: str | Path | None = None,
        service_name: str = "tinkertrace-serve",
        capture_content: bool = True,
        request_token_ids: bool = True,
        rollout_idle_s: float = 3600.0,
        roll_s: float = 5.0,
        **options: Any,
    ) -> None:
        if collector is None and spans_dir is None:
            raise ValueError("a recorder needs a collector URL or a spans folder (or both)")
        self.rt = sdk_runtime.private_runtime(
            endpoint=collector,
            spans_dir=spans_dir,
            spool_dir=spool_dir,
            service_name=service_name,
            capture_content=capture_content,
            request_token_ids=request_token_ids,
            **options,
        )
        self.rollout_idle_s = rollout_idle_s
        self._rollouts: dict[str, ServedRollout] = {}
        self._finished: dict[str, FinishedRollout] = {}  # by rollout id, newest last (bounded)
        self._lock = threading.Lock()
        self.calls_recorded = 0
        self._closed = threading.Event()
        if spans_dir is not None:  # the spans folder's open files are closed (readable) this often
            threading.Thread(target=self._roll, args=(roll_s,), name="tinkertrace-roll", daemon=True).start()

    def _roll(self, every_s: float) -> None:
        while not self._closed.wait(every_s):
            sdk_runtime.flush_runtime(self.rt, 30.0)

    # --- calls ---------------------------------------------------------------------------------------
    async def open_call(self, request: Request, kind: str) -> LlmCall | None:
        """An :class:`LlmCall` for ``request`` (a JSON object body), its span started; None for a body
        that is not a JSON object (the handler answers it with a 400, nothing to record). A malformed
        identity header is a 400 :class:`ApiError`."""
        identity = CallIdentity.from_headers(request.headers)
        raw = await request.body()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(body, dict):
            return None
        parent = caller_span(request.headers)
        rollout = self._rollout_for(identity, parent) if identity.rollout_id else None
        with _inside(rollout, parent):
            call = ServedCall(
                self.rt, kind, httpx.URL(str(request.url)), body, raw, rollout.state if rollout else None
            )
        if rollout is not None:
            rollout.answers.track(call)
        call.span.context_attributes[semconv.LLM_CAPTURE_SIDE] = semconv.CAPTURE_SERVER
        extended = call.extended_body()  # ask for ids and logprobs as the SDK does (listed on the span)
        if extended is not None:
            request._body = extended  # Starlette's cached body: the handler reads the extended request
        agent = identity.agent_name or (rollout.agent_name if rollout else None)
        if agent:
            call.span.context_attributes[semconv.AGENT_NAME] = agent
        request.state.llm_call = call  # for a handler that must know it (the proxy retries refusals)
        return call

    def close_call(self, call: LlmCall, response: Response) -> Response:
        """Record ``response`` as the answer to ``call``: at once for a whole body, as it is sent for a
        stream (the span ends when the stream ends or the client goes away)."""
        call.status = response.status_code
        call.headers = response.headers
        self.calls_recorded += 1
        if not isinstance(response, StreamingResponse):
            call.feed(bytes(response.body))
            call.finish()
            return response
        response.body_iterator = _teed(response.body_iterator, call)
        return response

    # --- rollouts ------------------------------------------------------------------------------------
    def _stored_id(self, identity: CallIdentity) -> str:
        """The rollout id a new rollout of ``identity`` is recorded under (call with the lock held): its
        own, or ``{id}/attempt/{n}`` when a higher attempt reopens a finished one (no id sent can
        contain '/', so it is never another's); a 409 for a call under a finished rollout."""
        assert identity.rollout_id is not None
        ended = self._finished.get(identity.rollout_id)
        if ended is None:
            return identity.rollout_id
        if identity.attempt <= ended.attempt:
            raise ApiError(
                409,
                f"Rollout '{identity.rollout_id}' has already finished ({ended.status}, attempt "
                f"{ended.attempt}): a call after its end is not added to it. To try it again, reopen it "
                f"with a new attempt (URL /rollouts/{identity.rollout_id}/attempt/{ended.attempt + 1}"
                f"/v1 or header x-tinkertrace-attempt: {ended.attempt + 1}), or name a new rollout id.",
                code="rollout_finished",
            )
        return f"{identity.rollout_id}/attempt/{identity.attempt}"

    def _rollout_for(self, identity: CallIdentity, parent: SpanContext | None) -> ServedRollout:
        """The open rollout of ``identity.rollout_id``, started (its root span opened) on first sight
        (see :meth:`_stored_id` for a rollout id that has finished)."""
        assert identity.rollout_id is not None
        now = time.monotonic()
        with self._lock:
            rollout = self._rollouts.get(identity.rollout_id)
            if rollout is not None:
                rollout.last_seen = now
                return rollout
            stored_id = self._stored_id(identity)
            self._forget_idle(now)
            attributes = {
                semconv.ROLLOUT_ID: stored_id,
                semconv.TASK_ID: identity.task_id or identity.rollout_id,
                semconv.ATTEMPT: identity.attempt,
                semconv.SPLIT: identity.split,
            }
            with _inside(None, parent):
                span = start_span(
                    self.rt, f"rollout {identity.agent_name or 'served'}", semconv.TYPE_ROLLOUT, attributes
                )
            state = RolloutState(
                stored_id, str(attributes[semconv.TASK_ID]), identity.attempt, identity.split, span
            )
            rollout = ServedRollout(state, identity.agent_name, now)
            self._rollouts[identity.rollout_id] = rollout
            return rollout

    def _forget_idle(self, now: float) -> None:
        """Forget rollouts without a call for ``rollout_idle_s`` (their root spans are never written)."""
        idle = [rid for rid, r in self._rollouts.items() if now - r.last_seen > self.rollout_idle_s]
        for rid in idle:
            del self._rollouts[rid]

    def _open_rollout(self, rollout_id: str) -> ServedRollout:
        with self._lock:
            rollout = self._rollouts.get(rollout_id)
            ended = self._finished.get(rollout_id)
        if rollout is not None:
            return rollout
        if ended is not None:
            raise ApiError(
                409, f"Rollout '{rollout_id}' has already finished ({ended.status}).", code="rollout_finished"
            )
        raise ApiError(
            404,
            f"No call of rollout '{rollout_id}' was served here: a rollout starts with its first call "
            "(rollout id in the URL prefix /rollouts/{id}/v1 or the x-tinkertrace-rollout-id header).",
            code="rollout_not_found",
        )

    def reward(self, rollout_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Record a reward span for an open rollout from a request body (400 when malformed)."""
        value = body.get("value")
        name = body.get("name", semconv.PRIMARY_REWARD)
        primary, response_id = body.get("primary"), body.get("response_id")
        if value is None:
            raise ApiError(400, "Missing required parameter: 'value' (a number or an object of numbers).")
        for param, given in (("name", name), ("primary", primary), ("response_id", response_id)):
            if given is not None and not isinstance(given, str):
                raise ApiError(400, f"Invalid type for '{param}': expected a string.", param=param)
        if isinstance(value, bool):
            raise ApiError(400, "Invalid 'value': expected a number, not a boolean.", param="value")
        try:
            attributes = reward_attributes(value, name, primary=primary, response_id=response_id)
        except ValueError as exc:
            raise ApiError(400, f"Invalid 'value': {exc}.", param="value") from exc
        rollout = self._open_rollout(rollout_id)
        if response_id is not None and response_id not in rollout.answers:
            raise ApiError(
                404,
                f"Rollout '{rollout_id}' served no answer with id '{response_id}': a reward's 'response_id' "
                "names the id of one of this rollout's answers. Nothing was recorded.",
                param="response_id",
                code="response_not_found",
            )
        with _inside(rollout, None):
            start_span(self.rt, semconv.REWARD_SPAN_NAME, semconv.TYPE_REWARD, attributes).end()
        return {"rollout_id": rollout_id, "rewards": rollout.state.rewards}

    def finish(self, rollout_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """End an open rollout's span with ``status`` (default succeeded) and its counts."""
        status = body.get("status", semconv.STATUS_SUCCEEDED)
        if status not in ROLLOUT_STATUSES:
            raise ApiError(
                400,
                f"Invalid 'status': expected one of {', '.join(ROLLOUT_STATUSES)}, got {status!r}.",
                param="status",
            )
        rollout = self._open_rollout(rollout_id)
        with self._lock:
            if self._rollouts.pop(rollout_id, None) is None:  # another finish won the race
                raise ApiError(409, f"Rollout '{rollout_id}' has already finished.", code="rollout_finished")
            self._finished[rollout_id] = FinishedRollout(status, rollout.state.attempt)
            while len(self._finished) > 100_000:
                del self._finished[next(iter(self._finished))]
        state = rollout.state
        state.span.set_attributes(
            {
                semconv.ROLLOUT_STATUS: status,
                semconv.ROLLOUT_LLM_CALLS: state.llm_calls,
                semconv.ROLLOUT_REWARDS: state.rewards,
                semconv.ROLLOUT_AGENT_SPANS: state.agent_spans,
            }
        )
        ok = status == semconv.STATUS_SUCCEEDED
        state.span.set_status(Status(StatusCode.OK if ok else StatusCode.ERROR))
        state.span.end()
        ended = {
            "rollout_id": rollout_id,
            "status": status,
            "llm_calls": state.llm_calls,
            "rewards": state.rewards,
        }
        if state.rollout_id != rollout_id:  # a reopened attempt
            ended["recorded_as"] = state.rollout_id
        return ended

    def stats(self) -> dict[str, Any]:
        """What ``/health`` shows: calls recorded, rollouts open, and the SDK's export counts."""
        with self._lock:
            open_rollouts = len(self._rollouts)
        return {
            "calls_recorded": self.calls_recorded,
            "open_rollouts": open_rollouts,
            **self.rt.stats.snapshot(),
        }

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Export every recorded span now (True when all reached the collector / spans folder)."""
        return sdk_runtime.flush_runtime(self.rt, timeout_s)

    def close(self, timeout_s: float = 30.0) -> bool:
        """Flush and shut the exporters down (what could not be sent stays in the spool); once."""
        with self._lock:
            if self._closed.is_set():
                return True
            self._closed.set()
        return sdk_runtime.close_runtime(self.rt, timeout_s)


def rollout_routes(recorder: CallRecorder | None, guard: Callable[[Handler], Handler]) -> list[Route]:
    """``POST /v1/rollouts/{id}/reward`` and ``/finish`` (each behind ``guard``): a reward span from
    ``{"value", "name"?, "primary"?, "response_id"?}``, the rollout's end from ``{"status"?}``. Without
    a recorder they answer 404, saying how to turn recording on."""

    def recording() -> CallRecorder:
        if recorder is None:
            raise ApiError(
                404,
                "Recording is off: start with --collector URL or --spans-dir DIR to record calls, rewards "
                "and rollouts.",
                code="recording_disabled",
            )
        return recorder

    async def reward(request: Request) -> Response:
        body = require_object(await read_json(request))
        return JSONResponse(recording().reward(request.path_params["rollout_id"], body))

    async def finish(request: Request) -> Response:
        body = require_object(await read_json(request)) if (await request.body()).strip() else {}
        return JSONResponse(recording().finish(request.path_params["rollout_id"], body))

    return [
        Route("/v1/rollouts/{rollout_id}/reward", guard(reward), methods=["POST"]),
        Route("/v1/rollouts/{rollout_id}/finish", guard(finish), methods=["POST"]),
    ]


async def _teed(body: AsyncIterable[Any], call: LlmCall) -> AsyncIterator[Any]:
    """``body``'s chunks, each also fed to ``call``; the call ends with the stream."""
    finished = False
    try:
        async for chunk in body:
            call.feed(bytes(chunk) if isinstance(chunk, bytes | bytearray) else str(chunk).encode())
            yield chunk
        finished = True
    finally:
        call.finish(closed_early=not finished)
