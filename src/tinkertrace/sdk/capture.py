"""Automatic capture of OpenAI-compatible LLM calls made through ``httpx`` and ``httpx2``.

``install()`` wraps ``Client._send_single_request`` and ``AsyncClient._send_single_request`` of both
libraries (the one point every request passes, whatever the transport: the OpenAI client 3.x uses
``httpx2``, LiteLLM and others ``httpx``, some with their own transports). Inside a rollout, a POST
to a path ending in ``/chat/completions``, ``/completions`` or ``/responses``:

* gets ``return_token_ids: true`` and ``logprobs`` (chat: ``true``; completions: ``1``; responses:
  ``include: ["message.output_text.logprobs"]``) added when absent (``request_token_ids=False``
  turns this off). The agent then receives those extra response fields too; OpenAI client objects
  keep them as extra attributes. A 400 to the extended request is answered by sending the original
  body again; only if that is taken is that endpoint left unextended (see :mod:`.refusals`).
* becomes a GenAI CLIENT span whose response body is teed: the agent reads every byte (every SSE
  chunk) unchanged, and the span ends when the body is exhausted or closed.
"""

from __future__ import annotations

import functools
import importlib
import logging
import threading
import time
import traceback
import zlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import orjson
from opentelemetry import trace
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from tinkertrace import semconv
from tinkertrace.sdk import responses_api, runtime
from tinkertrace.sdk.context import ROLLOUT
from tinkertrace.sdk.response_parse import ResponseRecord, parse_json, parse_sse
from tinkertrace.sdk.spans import context_attributes
from tinkertrace.sdk.tokens import token_attributes

log = logging.getLogger("tinkertrace")

LIBRARIES = ("httpx", "httpx2")
_originals: dict[tuple[type, str], Callable[..., Any]] = {}


class LlmCall:
    """One captured call: the span, the request it was made from, the response bytes seen so far.

    The agent's thread does only what must happen in line: take the span's ids and start time, extend
    the request, tee the response bytes, queue the call when it ends. The span itself (a leaf: nothing
    runs inside it) is built by :meth:`build_span` on the export thread, with the request parameters,
    messages, the parsed response and packed token ids.
    """

    def __init__(
        self, rt: runtime.Runtime, kind: str, request: Any, body: dict[str, Any], raw: bytes
    ) -> None:
        self.rt = rt
        self.kind = kind
        self.body = body
        self.raw = raw
        self.url = request.url
        # where a refusal of the added fields holds: one API of one server (a server may take them
        # on /chat/completions and refuse them on /responses)
        self.endpoint = self.url.netloc.decode("ascii", "replace") + self.url.path
        self.injected: list[str] = []
        self.raw_sent = raw  # the body as sent (the agent's, or re-serialised with an extended include)
        self._chunks: list[bytes] = []
        self._done = False
        self._closed_early = False
        self._end_lock = threading.Lock()
        self._last_read_ns = 0  # when the agent last received response bytes
        self.status = 0
        self.headers: Any = {}
        self.start_ns = time.time_ns()
        self.end_ns = 0
        self.context_attributes = context_attributes(semconv.TYPE_LLM)
        self.error_attributes: dict[str, Any] = {}
        self.events: list[Event] = []
        self.span_status = Status(StatusCode.UNSET)
        self.parent, self.context = _span_context(rt)
        self.rollout = ROLLOUT.get()  # ends this call if it is still open when the rollout ends

    # --- request side ------------------------------------------------------------------------------
    def input_messages(self) -> list[dict[str, Any]]:
        if self.kind == "responses":
            return responses_api.input_messages(self.body)
        if self.kind == "chat":
            messages = self.body.get("messages")
            return messages if isinstance(messages, list) else []
        return [{"role": "user", "content": self.body.get("prompt")}]

    def _messages_json(self, messages: list[dict[str, Any]]) -> str:
        redact = self.rt.config.redact
        if redact is not None:
            messages = redact(orjson.loads(orjson.dumps(messages, default=str)))  # a private copy
        return orjson.dumps(messages, default=str).decode()

    def request_attributes(self) -> dict[str, Any]:
        """Server, streaming flag, model, sampling parameters and (content capture on) messages."""
        body, url = self.body, self.url
        host = str(url.host)
        attributes: dict[str, Any] = {
            semconv.GENAI_PROVIDER: "openai" if host.endswith("openai.com") else "openai_compatible",
            "server.address": host,
            semconv.LLM_STREAMING: bool(body.get("stream")),
            semconv.LLM_INJECTED: self.injected,
        }
        if url.port:
            attributes["server.port"] = int(url.port)
        model = body.get("model")
        if isinstance(model, str):
            attributes[semconv.GENAI_REQUEST_MODEL] = model
        for key, attr in (("temperature", semconv.GENAI_TEMPERATURE), ("top_p", semconv.GENAI_TOP_P)):
            if isinstance(body.get(key), int | float):
                attributes[attr] = float(body[key])
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens", body.get("max_output_tokens")))
        if isinstance(max_tokens, int):
            attributes[semconv.GENAI_MAX_TOKENS] = max_tokens
        stop = body.get("stop")
        if isinstance(stop, str):
            attributes[semconv.GENAI_STOP] = [stop]
        elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
            attributes[semconv.GENAI_STOP] = stop
        if self.rt.config.capture_content:
            attributes[semconv.GENAI_INPUT_MESSAGES] = self._messages_json(self.input_messages())
        return attributes

    def inject(self, lib: ModuleType, request: Any) -> None:
        """Ask the server for token ids and logprobs (fields absent from the request only)."""
        if not self.rt.config.request_token_ids:
            return
        if self.rt.refused_endpoints.skip(self.endpoint):
            return
        add = b""
        if self.body.get(semconv.REQUEST_RETURN_TOKEN_IDS) is None:
            add += b',"' + semconv.REQUEST_RETURN_TOKEN_IDS.encode() + b'":true'
            self.injected.append(semconv.REQUEST_RETURN_TOKEN_IDS)
        if self.kind == "responses":
            include = self.body.get("include")
            if include is None:
                add += b',"include":["' + responses_api.INCLUDE_LOGPROBS.encode() + b'"]'
                self.injected.append("include")
            elif isinstance(include, list) and responses_api.INCLUDE_LOGPROBS not in include:
                # the agent's own list gains one value: the one case where the body is re-serialised
                extended = {**self.body, "include": [*include, responses_api.INCLUDE_LOGPROBS]}
                self.injected.append("include")
                self.raw_sent = orjson.dumps(extended)
        elif self.body.get("logprobs") is None:
            add += b',"logprobs":true' if self.kind == "chat" else b',"logprobs":1'
            self.injected.append("logprobs")
        raw = self.raw_sent.rstrip()
        if not raw.endswith(b"}") or raw == b"{}":
            self.injected, self.raw_sent = [], self.raw
            return
        if not add:
            if self.raw_sent is not self.raw:
                _set_body(lib, request, self.raw_sent)
            return
        # Splice the fields in before the closing brace: no re-serialisation of the agent's body.
        _set_body(lib, request, raw[:-1] + add + b"}")

    def drop_injection(self, lib: ModuleType, request: Any) -> None:
        """The extended request got a 400: restore the agent's body to send it again."""
        _set_body(lib, request, self.raw)
        self._refused_fields, self.injected = tuple(self.injected), []

    def judge_refusal(self, status: int) -> None:
        """After the agent's own body was sent again: if it was taken, the added fields were what the
        server refused, and the endpoint is not extended again until the mark is re-checked; if it also
        got a 400 the error was the request's own (e.g. context length) and nothing is marked."""
        refused = status < 400
        if refused:
            self.rt.refused_endpoints.mark(self.endpoint)
        name = "tinkertrace.injection_refused" if refused else "tinkertrace.injection_not_at_fault"
        self.events.append(Event(name, {"fields": self._refused_fields, "retry_status": status}))

    # --- response side -----------------------------------------------------------------------------
    def attach(self, response: Any, tee: type) -> Any:
        """Note the response's status and headers (read on the export thread) and tee its body."""
        self.status = int(response.status_code)
        self.headers = response.headers
        response.stream = tee(response.stream, self)
        return response

    def retry_without_injection(self, response: Any) -> bool:
        """Whether a 400 answer may be the server refusing the fields the SDK added."""
        return bool(self.injected) and response.status_code == 400

    def feed(self, chunk: bytes) -> None:
        if not self._done:  # bytes read after the call was ended (with its rollout) are not recorded
            self._chunks.append(chunk)
            self._last_read_ns = time.time_ns()

    def _claim_end(self) -> bool:
        """True for the one caller that ends the call (the agent's thread and the rollout's may race)."""
        with self._end_lock:
            if self._done:
                return False
            self._done = True
            return True

    def end_with_rollout(self) -> None:
        """The rollout is ending and this call is still open: a stream the agent broke out of without
        closing, or keeps open. It ends now as closed early, with what had been read, at the time the
        agent last received bytes of it (so a reward given after it follows it)."""
        if not self._claim_end():
            return
        self._closed_early = True
        self.events.append(Event("tinkertrace.ended_with_rollout"))
        self._end(self._last_read_ns or None)

    def fail(self, exc: BaseException) -> None:
        if not self._claim_end():
            return
        try:
            self.events.append(_exception_event(exc))
            self.error_attributes["error.type"] = type(exc).__qualname__
            self.span_status = Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}")
        finally:
            self._end()

    def finish(self, closed_early: bool = False) -> None:
        """End the span (once); it is built and the response recorded on the export thread."""
        if not self._claim_end():
            return
        self._closed_early = closed_early
        try:
            if self.status >= 400:
                body = self._body()
                self.error_attributes["error.type"] = str(self.status)
                message = f"HTTP {self.status}: {body[:300].decode(errors='replace')}"
                self.span_status = Status(StatusCode.ERROR, message)
        except Exception as exc:
            self.error_attributes[semconv.LLM_CAPTURE_ERROR] = f"{type(exc).__name__}: {exc}"
        finally:
            self._end()

    def _end(self, end_ns: int | None = None) -> None:
        self.end_ns = end_ns or time.time_ns()
        if self.rollout is not None:
            self.rollout.call_ended(self)
        self.rt.processor.submit(self.build_span)

    def build_span(self) -> ReadableSpan:
        """The finished span (on the export thread)."""
        model = self.body.get("model")
        operation = "text_completion" if self.kind == "completion" else "chat"
        attributes = {
            **self.context_attributes,
            semconv.GENAI_OPERATION: operation,
            **self.export_attributes(),
            **self.error_attributes,
        }
        return ReadableSpan(
            name=f"{operation} {model}" if isinstance(model, str) else operation,
            context=self.context,
            parent=self.parent,
            resource=self.rt.provider.resource,
            attributes=attributes,
            events=tuple(self.events),
            kind=SpanKind.CLIENT,
            status=self.span_status,
            start_time=self.start_ns,
            end_time=self.end_ns,
            instrumentation_scope=self.rt.scope,
        )

    def _body(self) -> bytes:
        body = b"".join(self._chunks)
        encoding = self.headers.get("content-encoding", "").lower()
        if encoding in ("gzip", "deflate", "x-gzip"):
            return zlib.decompress(body, wbits=47)
        if encoding not in ("", "identity"):
            raise ValueError(f"content-encoding {encoding!r} is not decoded by tinkertrace")
        return body

    def export_attributes(self) -> dict[str, Any]:
        """The span's request and response attributes (run once the call has ended); never raises."""
        attrs = self.request_attributes()
        if self.status:
            attrs["http.response.status_code"] = self.status
        if self._closed_early:
            attrs[semconv.LLM_CLOSED_EARLY] = True
        if not self._done or not self.status or self.status >= 400:
            return attrs  # failed or refused: nothing to parse
        try:
            body = self._body()
            streaming = "text/event-stream" in self.headers.get("content-type", "")
            if self.kind == "responses":
                record = responses_api.parse_sse(body) if streaming else responses_api.parse_json(body)
            else:
                record = parse_sse(body) if streaming else parse_json(body)
            attrs.update(self._response_attributes(record))
            attrs.update(token_attributes(self.rt, self.kind, self.body, record))
        except Exception as exc:
            attrs[semconv.LLM_CAPTURE_ERROR] = f"{type(exc).__name__}: {exc}"
        return attrs

    def _response_attributes(self, record: ResponseRecord) -> dict[str, Any]:
        attrs: dict[str, Any] = {}
        if record.response_id:
            attrs[semconv.GENAI_RESPONSE_ID] = str(record.response_id)
        if record.model:
            attrs[semconv.GENAI_RESPONSE_MODEL] = str(record.model)
        choices = [record.choices[i] for i in sorted(record.choices)]
        attrs[semconv.GENAI_FINISH_REASONS] = [c.finish_reason or "" for c in choices]
        attrs[semconv.LLM_CHOICES] = len(choices)
        usage = record.usage or {}
        if isinstance(usage.get("prompt_tokens"), int):
            attrs[semconv.GENAI_INPUT_TOKENS] = usage["prompt_tokens"]
        if isinstance(usage.get("completion_tokens"), int):
            attrs[semconv.GENAI_OUTPUT_TOKENS] = usage["completion_tokens"]
        version = record.policy_version
        header_version = self.headers.get(semconv.HEADER_POLICY_VERSION)
        if version is None and header_version and header_version.lstrip("-").isdigit():
            version = int(header_version)
        if version is not None:
            attrs[semconv.POLICY_VERSION] = version
        if self.rt.config.capture_content:
            attrs[semconv.GENAI_OUTPUT_MESSAGES] = self._messages_json([c.message() for c in choices])
        return attrs


def _span_context(rt: runtime.Runtime) -> tuple[SpanContext | None, SpanContext]:
    """``(parent, own)`` span contexts of a new span under the current span, as OTel would make them."""
    parent = trace.get_current_span().get_span_context()
    ids = rt.provider.id_generator
    if parent.is_valid:
        flags = TraceFlags(parent.trace_flags | TraceFlags.SAMPLED)
        own = SpanContext(parent.trace_id, ids.generate_span_id(), False, flags, parent.trace_state)
        return parent, own
    flags = TraceFlags(TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID)
    return None, SpanContext(ids.generate_trace_id(), ids.generate_span_id(), False, flags)


def _exception_event(exc: BaseException) -> Event:
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


def _set_body(lib: ModuleType, request: Any, content: bytes) -> None:
    request._content = content
    request.stream = lib.ByteStream(content)
    request.headers["Content-Length"] = str(len(content))


def _classify(request: Any) -> str | None:
    if request.method != "POST":
        return None
    path = request.url.path
    if path.endswith("/responses"):
        return "responses"
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/completions"):
        return "completion"
    return None


def begin(lib: ModuleType, request: Any) -> LlmCall | None:
    """An :class:`LlmCall` for an LLM request inside a rollout, else None. Never raises."""
    kind = _classify(request)
    if kind is None or ROLLOUT.get() is None:
        return None
    rt = runtime.current()
    if rt is None:
        return None
    try:
        raw = request.content
        body = orjson.loads(raw)
        if not isinstance(body, dict):
            return None
        call = LlmCall(rt, kind, request, body, raw)
        call.inject(lib, request)
        if call.rollout is not None:
            call.rollout.call_opened(call)
        return call
    except Exception as exc:  # an unreadable request is passed on untraced
        log.debug("tinkertrace: not capturing %s: %s", request.url, exc)
        return None


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


def _tee_types(lib: ModuleType) -> tuple[type, type]:
    class SyncTee(lib.SyncByteStream):  # type: ignore[name-defined,misc]
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

    class AsyncTee(lib.AsyncByteStream):  # type: ignore[name-defined,misc]
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


def _wrap_sync(lib: ModuleType, original: Callable[..., Any], tee: type) -> Callable[..., Any]:
    @functools.wraps(original)
    def _send_single_request(self: Any, request: Any) -> Any:
        call = begin(lib, request)
        if call is None:
            return original(self, request)
        try:
            response = original(self, request)
            if call.retry_without_injection(response):
                response.close()
                call.drop_injection(lib, request)
                response = original(self, request)
                call.judge_refusal(response.status_code)
        except BaseException as exc:
            call.fail(exc)
            raise
        return call.attach(response, tee)

    return _send_single_request


def _wrap_async(lib: ModuleType, original: Callable[..., Any], tee: type) -> Callable[..., Any]:
    @functools.wraps(original)
    async def _send_single_request(self: Any, request: Any) -> Any:
        call = begin(lib, request)
        if call is None:
            return await original(self, request)
        try:
            response = await original(self, request)
            if call.retry_without_injection(response):
                await response.aclose()
                call.drop_injection(lib, request)
                response = await original(self, request)
                call.judge_refusal(response.status_code)
        except BaseException as exc:
            call.fail(exc)
            raise
        return call.attach(response, tee)

    return _send_single_request


def install() -> list[str]:
    """Patch every importable library in :data:`LIBRARIES`; returns the names patched."""
    patched = []
    for name in LIBRARIES:
        try:
            lib = importlib.import_module(name)
        except ImportError:
            continue
        sync_tee, async_tee = _tee_types(lib)
        for cls, wrap, tee in ((lib.Client, _wrap_sync, sync_tee), (lib.AsyncClient, _wrap_async, async_tee)):
            key = (cls, "_send_single_request")
            if key not in _originals:
                _originals[key] = cls._send_single_request
                cls._send_single_request = wrap(lib, _originals[key], tee)
        patched.append(name)
    return patched


def uninstall() -> None:
    """Restore the original methods."""
    for (cls, attr), original in list(_originals.items()):
        setattr(cls, attr, original)
        del _originals[(cls, attr)]
