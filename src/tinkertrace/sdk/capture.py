"""Automatic capture of OpenAI-compatible LLM calls made through ``httpx`` and ``httpx2``.

The capture sits in httpx's own layering, at the transport: ``handle_request(request) -> response``
(:mod:`.capture_transport`). :mod:`.capture_hooks` wraps the two default transports of both libraries
(``HTTPTransport.handle_request``, ``AsyncHTTPTransport.handle_async_request``: the OpenAI client
3.x uses ``httpx2``, LiteLLM and others ``httpx``), and :func:`~.capture_transport.traced_transport`
wraps any other transport a client brings (``httpx.Client(transport=traced_transport(mine))``). Clients
with a transport of their own that nobody wrapped are reached by a fallback on a private method of the
client, fenced in :mod:`.capture_fallback` and used only for the library versions it was tested on.

Inside a rollout, a POST to a path ending in ``/chat/completions``, ``/completions`` or ``/responses``:

* gets ``return_token_ids: true`` and ``logprobs`` (chat: ``true``; completions: ``1``; responses:
  ``include: ["message.output_text.logprobs"]``) added when absent (``request_token_ids=False``
  turns this off): the request is rebuilt with the public ``Request`` constructor. The agent then
  receives those extra response fields too; OpenAI client objects keep them as extra attributes. A 400
  to the extended request is answered by sending the original body again; only if that is taken is
  that endpoint left unextended (see :mod:`.refusals`).
* becomes a GenAI CLIENT span whose response body is teed: the agent reads every byte (every SSE
  chunk) unchanged, and the span ends when the body is exhausted or closed.

What is recorded of a call is :class:`~tinkertrace.sdk.llm_call.LlmCall`'s; this module is the HTTP
side, whatever layer calls it (:func:`send`, :func:`send_async`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import orjson

from tinkertrace import semconv
from tinkertrace.sdk import runtime
from tinkertrace.sdk.context import AGENT, ROLLOUT
from tinkertrace.sdk.llm_call import LlmCall, call_kind

log = logging.getLogger("tinkertrace")

LIBRARIES = ("httpx", "httpx2")
CAPTURED = "tinkertrace.captured"
"""Request extension set on a request being captured: an inner layer (a wrapped transport inside a
wrapped one, the default transport under the fallback) passes it on untouched."""


def with_body(lib: ModuleType, request: Any, content: bytes) -> Any:
    """``request`` with ``content`` as its body (public ``Request`` constructor), marked captured."""
    headers = request.headers.copy()
    headers["Content-Length"] = str(len(content))
    extensions = {**request.extensions, CAPTURED: True}
    return lib.Request(request.method, request.url, headers=headers, content=content, extensions=extensions)


def _classify(request: Any) -> str | None:
    if request.method != "POST":
        return None
    kind = call_kind(request.url.path)
    return None if kind == "messages" else kind  # Anthropic calls: recorded at the endpoint / proxy


def _send_identity(request: Any, rollout: Any) -> None:
    """The rollout id, and the task, attempt, split and agent beside it, for a server that records the
    call (values that are not printable ASCII are left out: they cannot travel as header values)."""
    agent = AGENT.get()
    request.headers[semconv.HEADER_ROLLOUT_ID] = rollout.rollout_id
    identity = {
        semconv.HEADER_TASK_ID: rollout.task_id,
        semconv.HEADER_ATTEMPT: str(rollout.attempt),
        semconv.HEADER_SPLIT: rollout.split,
        semconv.HEADER_AGENT_NAME: agent.name if agent is not None else None,
    }
    for header, value in identity.items():
        if value and value.isascii() and value.isprintable():
            request.headers[header] = value


def begin(lib: ModuleType, request: Any) -> tuple[LlmCall | None, Any]:
    """For an LLM request inside a rollout: its :class:`LlmCall` and the request to send in its place
    (the body extended, the rollout's headers added, marked captured); else ``(None, request)``.
    Never raises."""
    rollout = ROLLOUT.get()
    if rollout is None or request.extensions.get(CAPTURED):  # most requests: nothing to classify
        return None, request
    kind = _classify(request)
    rt = runtime.current() if kind is not None else None
    if rt is None:
        return None, request
    try:
        raw = request.content
        body = orjson.loads(raw)
        if not isinstance(body, dict):
            return None, request
        call = LlmCall(rt, kind, request.url, body, raw, rollout)  # type: ignore[arg-type]
        sent = with_body(lib, request, call.extended_body() or raw)
        _send_identity(sent, rollout)
        rollout.call_opened(call)
        return call, sent
    except Exception as exc:  # an unreadable request is passed on untraced
        log.debug("tinkertrace: not capturing %s: %s", request.url, exc)
        return None, request


class _Outcome:
    """Around the iteration of a response body: ends the call as the iteration ends."""

    def __init__(self, call: LlmCall) -> None:
        self.call = call

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            self.call.finish()
        elif isinstance(exc, GeneratorExit):
            self.call.finish(closed_early=True)
        else:
            self.call.fail(exc)


@functools.cache
def _tee_types(lib: ModuleType) -> tuple[type, type]:
    """``lib``'s (sync, async) byte streams that feed a call as the agent reads them (made once)."""

    class SyncTee(lib.SyncByteStream):  # type: ignore[name-defined]
        def __init__(self, inner: Any, call: LlmCall) -> None:
            self._inner, self._call = inner, call

        def __iter__(self) -> Any:
            feed = self._call.feed
            with _Outcome(self._call):
                for chunk in self._inner:
                    feed(chunk)
                    yield chunk

        def close(self) -> None:
            try:
                self._inner.close()
            finally:
                self._call.finish(closed_early=True)

    class AsyncTee(lib.AsyncByteStream):  # type: ignore[name-defined]
        def __init__(self, inner: Any, call: LlmCall) -> None:
            self._inner, self._call = inner, call

        async def __aiter__(self) -> Any:
            feed = self._call.feed
            with _Outcome(self._call):
                async for chunk in self._inner:
                    feed(chunk)
                    yield chunk

        async def aclose(self) -> None:
            try:
                await self._inner.aclose()
            finally:
                self._call.finish(closed_early=True)

    return SyncTee, AsyncTee


@contextlib.contextmanager
def _failing(call: LlmCall) -> Iterator[None]:
    """Ends the call as failed if sending raises (the exception goes on to the agent)."""
    try:
        yield
    except BaseException as exc:
        call.fail(exc)
        raise


def send(lib: ModuleType, send_one: Callable[[Any], Any], request: Any) -> Any:
    """Send ``request`` with ``send_one`` (one request, one response: a transport's
    ``handle_request``), capturing it when it is an LLM call of a rollout."""
    call, request = begin(lib, request)
    if call is None:
        return send_one(request)
    with _failing(call):
        response = send_one(request)
        if call.retry_without_injection(response):  # resend the agent's own body
            response.close()
            request = with_body(lib, request, call.drop_injection())
            call.judge_refusal((response := send_one(request)).status_code)
    return call.attach(response, _tee_types(lib)[0])


async def send_async(lib: ModuleType, send_one: Callable[[Any], Any], request: Any) -> Any:
    """:func:`send` for an async transport's ``handle_async_request``."""
    call, request = begin(lib, request)
    if call is None:
        return await send_one(request)
    with _failing(call):
        response = await send_one(request)
        if call.retry_without_injection(response):
            await response.aclose()
            request = with_body(lib, request, call.drop_injection())
            call.judge_refusal((response := await send_one(request)).status_code)
    return call.attach(response, _tee_types(lib)[1])
