"""The endpoint records what it serves: every LLM call it answers as an LLM span of the SDK's contract.

A :class:`CallRecorder` holds a runtime of its own (:func:`tinkertrace.sdk.runtime.private_runtime`)
whose spans all go to the endpoint's :class:`~tinkertrace.serving.journal.Journal`, and makes each
span with the SDK's own :class:`~tinkertrace.sdk.llm_call.LlmCall`: the request body and the response
bytes go in, the span content (messages, packed token ids, logprobs, policy version, finish reasons)
is built on the journal's thread exactly as for a call the SDK captured in an agent. Every such span
says ``tinkertrace.llm.capture_side = server``. An answer (a whole body; a stream's last bytes; a
reward's or finish's 200) leaves only once its spans are durable in the journal (``durable``, the
default: see :mod:`.journal`); a record that cannot be stored gets a 503 (a stream is cut off).

Which rollout a call belongs to comes from the request (:mod:`.rollout_routing`): the headers
``x-tinkertrace-rollout-id`` / ``-task-id`` / ``-attempt`` / ``-split`` / ``-agent-name`` (a URL
prefix ``/rollouts/{id}/...`` sets the same), and W3C ``traceparent`` makes the span a child of the
caller's span. The first call of a rollout id opens it (:mod:`.served_rollouts`; its state is kept in
the journal, so it can be rewarded and finished after a restart); rewards posted over HTTP become
reward spans of the SDK's form, and ``finish`` writes the rollout span with its status and the counts
of LLM and reward spans, as ``@traced_rollout`` does. A rollout without a call or reward for
``rollout_idle_s`` is finished by the endpoint with status ``timed_out``. A rollout driven by the SDK
in the agent (its first call carried a ``traceparent``; the SDK writes its own rollout span) is never
finished here: its open state is forgotten after ``rollout_idle_s``.

A reward naming a ``response_id`` must name an answer of that rollout (:mod:`.served_calls`); a call
under a finished rollout id is a 409 unless it names a higher attempt, which reopens the rollout,
recorded as ``{id}/attempt/{n}``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanContext
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from tinkertrace import semconv
from tinkertrace.sdk import config as sdk_config
from tinkertrace.sdk import runtime as sdk_runtime
from tinkertrace.sdk.context import ROLLOUT
from tinkertrace.sdk.llm_call import LlmCall
from tinkertrace.sdk.rewards import reward_attributes
from tinkertrace.sdk.spans import start_span
from tinkertrace.serving.journal import Journal
from tinkertrace.serving.journal_delivery import Durable, JournalStats, JournalUnavailable
from tinkertrace.serving.journal_targets import default_journal_dir, targets_for
from tinkertrace.serving.openai_wire.errors import ApiError
from tinkertrace.serving.rollout_routing import CallIdentity
from tinkertrace.serving.served_calls import ServedCall
from tinkertrace.serving.served_rollouts import FinishedRollout, ServedRollout
from tinkertrace.serving.settings import DEFAULT_ROLLOUT_IDLE_S

ROLLOUT_STATUSES = (semconv.STATUS_SUCCEEDED, semconv.STATUS_FAILED)
_PROPAGATOR = TraceContextTextMapPropagator()


def caller_span(headers: Mapping[str, str]) -> SpanContext | None:
    """The caller's span named by a W3C ``traceparent`` header, or None (absent or malformed)."""
    if "traceparent" not in headers:
        return None
    parent = trace.get_current_span(_PROPAGATOR.extract(headers)).get_span_context()
    return parent if parent.is_valid else None


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
        journal_dir: str | Path | None = None,
        name: str = "serve",
        service_name: str = "tinkertrace-serve",
        capture_content: bool = True,
        request_token_ids: bool = True,
        durable: bool = True,
        rollout_idle_s: float = DEFAULT_ROLLOUT_IDLE_S,
        roll_s: float = 5.0,
        **options: Any,
    ) -> None:
        if collector is None and spans_dir is None:
            raise ValueError("a recorder needs a collector URL or a spans folder (or both)")
        config = sdk_config.resolve(endpoint=collector, spans_dir=spans_dir, spool_dir=spool_dir, **options)
        counts = JournalStats()
        targets = targets_for(config, counts, name)
        folder = Path(journal_dir) if journal_dir else default_journal_dir(config, name)
        self.journal = Journal(folder, targets, counts, roll_s=roll_s)
        self.rt = sdk_runtime.private_runtime(
            sink=self.journal,
            endpoint=collector,
            spans_dir=spans_dir,
            spool_dir=spool_dir,
            service_name=service_name,
            capture_content=capture_content,
            request_token_ids=request_token_ids,
            **options,
        )
        self.durable = durable
        self.rollout_idle_s = rollout_idle_s
        self._rollouts: dict[str, ServedRollout] = {}
        self._finished: dict[str, FinishedRollout] = {}  # by rollout id, newest last (bounded)
        self._lock = threading.Lock()
        self.calls_recorded = 0
        self.rollouts_timed_out = 0
        self._closed = threading.Event()
        for record in self.journal.recover(self.rt).values():  # what the previous run left open or finished
            key = str(record.get("key") or record["id"])
            if "status" in record:
                self._finished[key] = FinishedRollout(record["status"], record.get("attempt", 0))
            else:
                self._rollouts[key] = ServedRollout.from_record(record)
        self.journal.start()
        every_s = max(0.05, min(5.0, rollout_idle_s / 4))
        threading.Thread(target=self._expire, args=(every_s,), name="tinkertrace-expire", daemon=True).start()

    async def stored(self, durable: Durable) -> None:
        """Wait until the records of ``durable`` are on disk (not at all when ``durable`` is off); a 503
        :class:`ApiError` if they could not be stored."""
        if not self.durable:
            return
        try:
            await durable.wait()
        except JournalUnavailable as exc:
            raise ApiError(503, f"The call could not be recorded: {exc}", type="server_error") from exc

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

    async def close_call(self, call: LlmCall, response: Response) -> Response:
        """Record ``response`` as the answer to ``call``: a whole body is sent once its span is stored (a
        503 if it cannot be); a stream as it comes, its end once the span is stored (the span ends when
        the stream ends or the client goes away)."""
        call.status = response.status_code
        call.headers = response.headers
        self.calls_recorded += 1
        if not isinstance(response, StreamingResponse):
            with self.journal.capture() as durable:
                call.feed(bytes(response.body))
                call.finish()
            try:
                await self.stored(durable)
            except ApiError as err:
                return err.response()
            return response
        response.body_iterator = _teed(response.body_iterator, call, self)
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
        """The open rollout of ``identity.rollout_id``, opened (logged in the journal) on first sight
        (see :meth:`_stored_id` for a rollout id that has finished)."""
        assert identity.rollout_id is not None
        with self._lock:
            rollout = self._rollouts.get(identity.rollout_id)
            if rollout is not None:
                rollout.last_seen = time.monotonic()
                return rollout
            stored_id = self._stored_id(identity)
            with _inside(None, parent):
                rollout = ServedRollout.open(self.rt, identity, stored_id)
            self._rollouts[identity.rollout_id] = rollout
            self.journal.rollout_opened(rollout.record())  # logged before the call's span (queue order)
            return rollout

    def _expire(self, every_s: float) -> None:
        """Every ``every_s``: rollouts without a call or reward for ``rollout_idle_s`` are finished as
        ``timed_out`` (their rollout span written), or forgotten if driven by the SDK in the agent."""
        while not self._closed.wait(every_s):
            now = time.monotonic()
            with self._lock:
                idle = [r for r in self._rollouts.values() if now - r.last_seen > self.rollout_idle_s]
            for rollout in idle:
                if rollout.caller_driven:
                    with self._lock:
                        if self._rollouts.get(rollout.key) is rollout:
                            del self._rollouts[rollout.key]
                            self.journal.rollout_closed(rollout.closed_record(None))
                    continue
                try:
                    self._end_rollout(rollout.key, semconv.STATUS_TIMED_OUT)
                    self.rollouts_timed_out += 1
                except ApiError:  # finished meanwhile
                    continue

    def finished_status(self, rollout_id: str) -> str | None:
        """The status a rollout was finished with (kept across restarts, for the newest 100,000
        finished rollouts), or None if it is open or unknown."""
        with self._lock:
            ended = self._finished.get(rollout_id)
        return ended.status if ended is not None else None

    def _open_rollout(self, rollout_id: str) -> ServedRollout:
        with self._lock:
            rollout = self._rollouts.get(rollout_id)
            ended = self._finished.get(rollout_id)
        if rollout is not None:
            rollout.last_seen = time.monotonic()
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
        return self._end_rollout(rollout_id, status)

    def _end_rollout(self, rollout_id: str, status: str) -> dict[str, Any]:
        """Write the rollout's span with ``status`` and its counts, and log it as finished."""
        rollout = self._open_rollout(rollout_id)
        with self._lock:
            if self._rollouts.pop(rollout_id, None) is None:  # another finish won the race
                raise ApiError(409, f"Rollout '{rollout_id}' has already finished.", code="rollout_finished")
            self._finished[rollout_id] = FinishedRollout(status, rollout.state.attempt)
            while len(self._finished) > 100_000:
                del self._finished[next(iter(self._finished))]
        for call in rollout.state.take_open_calls():  # a stream still open ends with its rollout
            call.end_with_rollout()
        state = rollout.state
        self.rt.processor.on_end(rollout.end_span(self.rt, status))
        self.journal.rollout_closed(rollout.closed_record(status))
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
            "rollouts_timed_out": self.rollouts_timed_out,
            "durable": self.durable,
            **self.journal.health(),
        }

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Deliver every recorded span now (True when all reached the collector / spans folder)."""
        return self.journal.flush(timeout_s)

    def close(self, timeout_s: float = 30.0) -> bool:
        """Deliver what was recorded and stop (what could not be sent stays in the spool, the open
        rollouts in the journal); once. True when every span reached its targets."""
        with self._lock:
            if self._closed.is_set():
                return True
            self._closed.set()
        delivered = self.journal.flush(timeout_s)
        self.rt.provider.shutdown()  # the journal's too
        return delivered


async def _teed(body: AsyncIterable[Any], call: LlmCall, recorder: CallRecorder) -> AsyncIterator[Any]:
    """``body``'s chunks, each also fed to ``call``; the call ends with the stream. The last chunk (an
    OpenAI client stops reading at its ``data: [DONE]``, an Anthropic one at ``message_stop``) is held
    back until the call's span is stored, so a client never holds a whole answer that a crash could
    lose (else the stream is cut off); every other chunk goes out as the next one is ready."""
    held: Any = None
    try:
        async for chunk in body:
            call.feed(bytes(chunk) if isinstance(chunk, bytes | bytearray) else str(chunk).encode())
            if held is not None:
                yield held
            held = chunk
    except BaseException:
        call.finish(closed_early=True)
        raise
    with recorder.journal.capture() as durable:
        call.finish()
    await recorder.stored(durable)
    if held is not None:
        yield held
