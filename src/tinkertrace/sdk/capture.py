"""Automatic capture of OpenAI-compatible LLM calls made through ``httpx`` and ``httpx2``.

``install()`` wraps ``Client._send_single_request`` and ``AsyncClient._send_single_request`` of both
libraries (the one point every request passes, whatever the transport: the OpenAI client 3.x uses
``httpx2``, LiteLLM and others ``httpx``, some with their own transports). Inside a rollout, a POST
to a path ending in ``/chat/completions`` or ``/completions``:

* gets ``return_token_ids: true`` and ``logprobs`` (chat: ``true``; completions: ``1``) added when
  absent (``request_token_ids=False`` turns this off). The agent then receives those extra response
  fields too; OpenAI client objects keep them as extra attributes. A server that answers 400 to the
  extended request is asked again with the original body, and not extended again.
* becomes a GenAI CLIENT span whose response body is teed: the agent reads every byte (every SSE
  chunk) unchanged, and the span ends when the body is exhausted or closed.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import zlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import orjson
from opentelemetry.trace import SpanKind, Status, StatusCode

from tinkertrace import semconv
from tinkertrace.sdk import runtime
from tinkertrace.sdk.context import ROLLOUT
from tinkertrace.sdk.response_parse import ResponseRecord, parse_json, parse_sse
from tinkertrace.sdk.tokens import token_attributes

log = logging.getLogger("tinkertrace")

LIBRARIES = ("httpx", "httpx2")
_originals: dict[tuple[type, str], Callable[..., Any]] = {}


class LlmCall:
    """One captured call: the span, the request it was made from, the response bytes seen so far."""

    def __init__(
        self, rt: runtime.Runtime, kind: str, request: Any, body: dict[str, Any], raw: bytes
    ) -> None:
        self.rt = rt
        self.kind = kind
        self.body = body
        self.raw = raw
        self.injected: list[str] = []
        self._chunks: list[bytes] = []
        self._done = False
        self.status = 0
        self.content_type = ""
        self.content_encoding = ""
        self.header_policy_version: str | None = None
        url = request.url
        self.host = f"{url.host}:{url.port}"
        operation = "chat" if kind == "chat" else "text_completion"
        model = body.get("model")
        attributes: dict[str, Any] = {
            semconv.SPAN_TYPE: semconv.TYPE_LLM,
            semconv.GENAI_OPERATION: operation,
            semconv.GENAI_PROVIDER: "openai" if str(url.host).endswith("openai.com") else "openai_compatible",
            "server.address": str(url.host),
            semconv.LLM_STREAMING: bool(body.get("stream")),
        }
        if url.port:
            attributes["server.port"] = int(url.port)
        if isinstance(model, str):
            attributes[semconv.GENAI_REQUEST_MODEL] = model
        for key, attr in (
            ("temperature", semconv.GENAI_TEMPERATURE),
            ("top_p", semconv.GENAI_TOP_P),
        ):
            if isinstance(body.get(key), int | float):
                attributes[attr] = float(body[key])
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if isinstance(max_tokens, int):
            attributes[semconv.GENAI_MAX_TOKENS] = max_tokens
        stop = body.get("stop")
        if isinstance(stop, str):
            attributes[semconv.GENAI_STOP] = [stop]
        elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
            attributes[semconv.GENAI_STOP] = stop
        if rt.config.capture_content:
            attributes[semconv.GENAI_INPUT_MESSAGES] = self._messages_json(self.input_messages())
        name = f"{operation} {model}" if isinstance(model, str) else operation
        self.span = rt.tracer.start_span(name, kind=SpanKind.CLIENT, attributes=attributes)

    # --- request side ------------------------------------------------------------------------------
    def input_messages(self) -> list[dict[str, Any]]:
        if self.kind == "chat":
            messages = self.body.get("messages")
            return messages if isinstance(messages, list) else []
        return [{"role": "user", "content": self.body.get("prompt")}]

    def _messages_json(self, messages: list[dict[str, Any]]) -> str:
        redact = self.rt.config.redact
        if redact is not None:
            messages = redact(orjson.loads(orjson.dumps(messages, default=str)))  # a private copy
        return orjson.dumps(messages, default=str).decode()

    def inject(self, lib: ModuleType, request: Any) -> None:
        """Ask the server for token ids and logprobs (fields absent from the request only)."""
        if not self.rt.config.request_token_ids or self.host in self.rt.no_inject_hosts:
            return
        add: dict[str, Any] = {}
        if self.body.get(semconv.REQUEST_RETURN_TOKEN_IDS) is None:
            add[semconv.REQUEST_RETURN_TOKEN_IDS] = True
        if self.body.get("logprobs") is None:
            add["logprobs"] = True if self.kind == "chat" else 1
        raw = self.raw.rstrip()
        if not add or not raw.endswith(b"}"):
            return
        # Splice the fields in before the closing brace: no re-serialisation of the agent's body.
        extra = json.dumps(add, separators=(",", ":")).encode()[1:-1]
        _set_body(lib, request, raw[:-1] + b"," + extra + b"}")
        self.injected = list(add)
        self.span.set_attribute(semconv.LLM_INJECTED, self.injected)

    def drop_injection(self, lib: ModuleType, request: Any) -> None:
        """The server refused the extended request: restore the agent's body, stop extending."""
        self.rt.no_inject_hosts.add(self.host)
        _set_body(lib, request, self.raw)
        self.span.add_event("tinkertrace.injection_refused", {"fields": self.injected})
        self.injected = []
        self.span.set_attribute(semconv.LLM_INJECTED, [])

    # --- response side -----------------------------------------------------------------------------
    def on_response(self, response: Any) -> None:
        self.status = int(response.status_code)
        headers = response.headers
        self.content_type = headers.get("content-type", "")
        self.content_encoding = headers.get("content-encoding", "").lower()
        self.header_policy_version = headers.get(semconv.HEADER_POLICY_VERSION)
        self.span.set_attribute("http.response.status_code", self.status)

    def feed(self, chunk: bytes) -> None:
        self._chunks.append(chunk)

    def fail(self, exc: BaseException) -> None:
        if self._done:
            return
        self._done = True
        try:
            self.span.record_exception(exc)
            self.span.set_attribute("error.type", type(exc).__qualname__)
            self.span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        finally:
            self.span.end()

    def finish(self, closed_early: bool = False) -> None:
        """Record the response (once) and end the span; never raises."""
        if self._done:
            return
        self._done = True
        try:
            self._record(closed_early)
        except Exception as exc:
            self.span.set_attribute(semconv.LLM_CAPTURE_ERROR, f"{type(exc).__name__}: {exc}")
        finally:
            self.span.end()

    def _body(self) -> bytes:
        body = b"".join(self._chunks)
        if self.content_encoding in ("gzip", "deflate", "x-gzip"):
            return zlib.decompress(body, wbits=47)
        if self.content_encoding not in ("", "identity"):
            raise ValueError(f"content-encoding {self.content_encoding!r} is not decoded by tinkertrace")
        return body

    def _record(self, closed_early: bool) -> None:
        span = self.span
        if closed_early:
            span.set_attribute(semconv.LLM_CLOSED_EARLY, True)
        body = self._body()
        if self.status >= 400:
            span.set_attribute("error.type", str(self.status))
            span.set_status(
                Status(StatusCode.ERROR, f"HTTP {self.status}: {body[:300].decode(errors='replace')}")
            )
            return
        streaming = "text/event-stream" in self.content_type
        record = parse_sse(body) if streaming else parse_json(body)
        span.set_attributes(self._response_attributes(record))
        span.set_attributes(token_attributes(self.rt, self.kind, self.body, record))

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
        if (
            version is None
            and self.header_policy_version
            and self.header_policy_version.lstrip("-").isdigit()
        ):
            version = int(self.header_policy_version)
        if version is not None:
            attrs[semconv.POLICY_VERSION] = version
        if self.rt.config.capture_content:
            attrs[semconv.GENAI_OUTPUT_MESSAGES] = self._messages_json([c.message() for c in choices])
        return attrs


def _set_body(lib: ModuleType, request: Any, content: bytes) -> None:
    request._content = content
    request.stream = lib.ByteStream(content)
    request.headers["Content-Length"] = str(len(content))


def _classify(request: Any) -> str | None:
    if request.method != "POST":
        return None
    path = request.url.path
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
        return call
    except Exception as exc:  # an unreadable request is passed on untraced
        log.debug("tinkertrace: not capturing %s: %s", request.url, exc)
        return None


def _tee_types(lib: ModuleType) -> tuple[type, type]:
    class SyncTee(lib.SyncByteStream):  # type: ignore[name-defined,misc]
        def __init__(self, inner: Any, call: LlmCall) -> None:
            self._inner, self._call = inner, call

        def __iter__(self) -> Any:
            try:
                for chunk in self._inner:
                    self._call.feed(chunk)
                    yield chunk
            except GeneratorExit:
                self._call.finish(closed_early=True)
                raise
            except BaseException as exc:
                self._call.fail(exc)
                raise
            self._call.finish()

        def close(self) -> None:
            try:
                self._inner.close()
            finally:
                self._call.finish(closed_early=True)

    class AsyncTee(lib.AsyncByteStream):  # type: ignore[name-defined,misc]
        def __init__(self, inner: Any, call: LlmCall) -> None:
            self._inner, self._call = inner, call

        async def __aiter__(self) -> Any:
            try:
                async for chunk in self._inner:
                    self._call.feed(chunk)
                    yield chunk
            except GeneratorExit:
                self._call.finish(closed_early=True)
                raise
            except BaseException as exc:
                self._call.fail(exc)
                raise
            self._call.finish()

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
            if call.injected and response.status_code == 400:
                response.close()
                call.drop_injection(lib, request)
                response = original(self, request)
        except BaseException as exc:
            call.fail(exc)
            raise
        call.on_response(response)
        response.stream = tee(response.stream, call)
        return response

    return _send_single_request


def _wrap_async(lib: ModuleType, original: Callable[..., Any], tee: type) -> Callable[..., Any]:
    @functools.wraps(original)
    async def _send_single_request(self: Any, request: Any) -> Any:
        call = begin(lib, request)
        if call is None:
            return await original(self, request)
        try:
            response = await original(self, request)
            if call.injected and response.status_code == 400:
                await response.aclose()
                call.drop_injection(lib, request)
                response = await original(self, request)
        except BaseException as exc:
            call.fail(exc)
            raise
        call.on_response(response)
        response.stream = tee(response.stream, call)
        return response

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
