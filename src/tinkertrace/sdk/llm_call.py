"""One captured LLM call: the request it was made from, its span, and the response bytes seen so far.

The agent's thread does only what must happen in line: take the span's ids and start time (an
:class:`~tinkertrace.sdk.spans.LlmSpan`), extend the request body, tee the response bytes, end the
span when the call ends. Everything else (request parameters, messages, the parsed response, packed
token ids) is :meth:`LlmCall.span_content`, run on the export thread from data that no longer
changes. The HTTP side (which library, how the body is set and the response teed) is
:mod:`tinkertrace.sdk.capture`'s.
"""

from __future__ import annotations

import threading
import time
import zlib
from typing import Any

import orjson
from opentelemetry.sdk.trace import Event
from opentelemetry.trace import Status, StatusCode

from tinkertrace import semconv
from tinkertrace.sdk import anthropic_messages, responses_api
from tinkertrace.sdk.context import RolloutState
from tinkertrace.sdk.response_parse import ResponseRecord, parse_json, parse_sse
from tinkertrace.sdk.runtime import Runtime
from tinkertrace.sdk.spans import LlmSpan, SpanContent, exception_event
from tinkertrace.sdk.tokens import token_attributes


def call_kind(path: str) -> str | None:
    """The API a request path speaks: ``chat``, ``responses``, ``completion``, or ``messages``
    (Anthropic's, recorded by the endpoint and the proxy); None for any other path."""
    if path.endswith("/chat/completions"):
        return "chat"
    if path.endswith("/completions"):
        return "completion"
    if path.endswith("/responses"):
        return "responses"
    if path.endswith("/messages"):
        return "messages"
    return None


class LlmCall:
    """One captured call: where it went, the request body, the span, the response bytes so far."""

    def __init__(
        self, rt: Runtime, kind: str, url: Any, body: dict[str, Any], raw: bytes, rollout: RolloutState | None
    ) -> None:
        self.rt = rt
        self.kind = kind
        self.body = body
        self.raw = raw
        self.url = url
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
        self.span = LlmSpan(rt)
        self.error_attributes: dict[str, Any] = {}
        self.events: list[Event] = []
        self.span_status = Status(StatusCode.UNSET)
        self.rollout = rollout  # ends this call if it is still open when the rollout ends

    # --- request side ------------------------------------------------------------------------------
    def input_messages(self) -> list[dict[str, Any]]:
        if self.kind == "responses":
            return responses_api.input_messages(self.body)
        if self.kind == "messages":
            return anthropic_messages.input_messages(self.body)
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

    def extended_body(self) -> bytes | None:
        """The body asking the server for token ids and logprobs (fields absent from the agent's
        request only), or None to send the agent's body as it is."""
        if not self.rt.config.request_token_ids or self.rt.refused_endpoints.skip(self.endpoint):
            return None
        add = b""
        if self.body.get(semconv.REQUEST_RETURN_TOKEN_IDS) is None:
            add += b',"' + semconv.REQUEST_RETURN_TOKEN_IDS.encode() + b'":true'
            self.injected.append(semconv.REQUEST_RETURN_TOKEN_IDS)
        if self.kind == "responses":
            include = self.body.get("include")
            if include is None:
                add += b',"include":["' + semconv.RESPONSES_INCLUDE_LOGPROBS.encode() + b'"]'
                self.injected.append("include")
            elif isinstance(include, list) and semconv.RESPONSES_INCLUDE_LOGPROBS not in include:
                # the agent's own list gains one value: the one case where the body is re-serialised
                extended = {**self.body, "include": [*include, semconv.RESPONSES_INCLUDE_LOGPROBS]}
                self.injected.append("include")
                self.raw_sent = orjson.dumps(extended)
        elif self.body.get("logprobs") is None:
            add += b',"logprobs":true' if self.kind == "chat" else b',"logprobs":1'
            self.injected.append("logprobs")
        raw = self.raw_sent.rstrip()
        if not raw.endswith(b"}") or raw == b"{}":
            self.injected, self.raw_sent = [], self.raw
            return None
        if not add:
            return None if self.raw_sent is self.raw else self.raw_sent
        # Splice the fields in before the closing brace: no re-serialisation of the agent's body.
        return raw[:-1] + add + b"}"

    def drop_injection(self) -> bytes:
        """The extended request got a 400: the agent's own body, to send it again."""
        self._refused_fields, self.injected = tuple(self.injected), []
        return self.raw

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
            self.events.append(exception_event(exc))
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
        if self.rollout is not None:
            self.rollout.call_ended(self)
        self.span.end(end_ns or time.time_ns(), self.span_content, source=self)

    def span_content(self) -> SpanContent:
        """The span's name, attributes, events and status (on the export thread). A failure here
        (e.g. in the redaction hook) is recorded on the span, which keeps its rollout and ids."""
        model = self.body.get("model")
        operation = "text_completion" if self.kind == "completion" else "chat"
        attributes = {**self.span.context_attributes, semconv.GENAI_OPERATION: operation}
        try:
            attributes.update(self.export_attributes())
        except Exception as exc:
            attributes[semconv.LLM_CAPTURE_ERROR] = f"{type(exc).__name__}: {exc}"
        attributes.update(self.error_attributes)
        name = f"{operation} {model}" if isinstance(model, str) else operation
        return name, attributes, tuple(self.events), self.span_status

    @property
    def closed_early(self) -> bool:
        return self._closed_early

    def restore_ended(self, response: bytes, closed_early: bool) -> None:
        """Make this the ended call a record describes (the endpoint's journal replays one): its
        response bytes, and whether its stream was closed early."""
        self._chunks, self._done, self._closed_early = [response], True, closed_early

    def response_bytes(self) -> bytes:
        """The response body as received (still content-encoded)."""
        return b"".join(self._chunks)

    def _body(self) -> bytes:
        body = self.response_bytes()
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
            record = self.response_record()
            attrs.update(self._response_attributes(record))
            attrs.update(token_attributes(self.rt, self.kind, self.body, record))
        except Exception as exc:
            attrs[semconv.LLM_CAPTURE_ERROR] = f"{type(exc).__name__}: {exc}"
        return attrs

    def response_record(self) -> ResponseRecord:
        """The response bytes read so far, parsed by the call's API (raises when unreadable)."""
        body = self._body()
        streaming = "text/event-stream" in self.headers.get("content-type", "")
        if self.kind == "responses":
            return responses_api.parse_sse(body) if streaming else responses_api.parse_json(body)
        if self.kind == "messages":
            return anthropic_messages.parse_sse(body) if streaming else anthropic_messages.parse_json(body)
        return parse_sse(body) if streaming else parse_json(body)

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
