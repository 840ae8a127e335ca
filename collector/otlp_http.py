"""OTLP/HTTP receiver: ``POST /v1/traces`` (protobuf or JSON, optional gzip), served by :mod:`.http_server`.

Status codes follow the OTLP spec: 200 with an ``ExportTraceServiceResponse`` (``partial_success``
for rejected spans), 400 malformed, 401 missing/wrong bearer token, 413 too large, 415 unsupported
content type, 429 queue full and 503 unavailable (both with ``Retry-After``). Responses use the
request's encoding; errors are a ``google.rpc.Status``.
"""

from __future__ import annotations

import asyncio
import binascii
import hmac
import json
import logging
import time
import zlib
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tinkertrace.collector.http_server import Request, Response
from tinkertrace.collector.ingest import Ingestor, Overloaded, Unavailable
from tinkertrace.spanstore.otlp_arrow import ConversionResult, body_to_table
from tinkertrace.spanstore.varint import read_varint

log = logging.getLogger("tinkertrace.collector")

TRACES_PATH = "/v1/traces"
HEALTH_PATHS = ("/health", "/healthz")
PROTOBUF_TYPES = ("application/x-protobuf", "application/protobuf")
JSON_TYPE = "application/json"
JSON, PROTOBUF = JSON_TYPE.encode(), PROTOBUF_TYPES[0].encode()  # response content types
# Requests that arrive while this many conversions wait for the WAL are converted together once one is
# logged (group commit, one stage earlier); more than BATCH_BYTES waiting are converted at once.
CONVERSIONS_AHEAD = 1
BATCH_BYTES = 16 * 1024 * 1024


class BadRequest(Exception):
    """A request the client must not retry; ``status`` is the HTTP code."""

    def __init__(self, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or []


def hex_ids_to_base64(document: Any) -> None:
    """OTLP/JSON carries trace/span ids as hex; protobuf's JSON mapping expects base64. In place."""
    for r_index, resource_spans in enumerate(document.get("resourceSpans") or []):
        for scope_spans in resource_spans.get("scopeSpans") or []:
            for s_index, span in enumerate(scope_spans.get("spans") or []):
                where = f"resourceSpans[{r_index}] spans[{s_index}]"
                _convert_ids(span, where)
                for link in span.get("links") or []:
                    _convert_ids(link, f"{where} link")


def _convert_ids(holder: dict[str, Any], where: str) -> None:
    for key in ("traceId", "spanId", "parentSpanId"):
        value = holder.get(key)
        if isinstance(value, str) and value:
            try:
                holder[key] = binascii.b2a_base64(bytes.fromhex(value), newline=False).decode()
            except ValueError:
                raise BadRequest(400, f"{where}: {key} {value!r} is not hex") from None


def parse_json_request(body: bytes) -> ExportTraceServiceRequest:
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(400, f"body is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise BadRequest(400, "body must be a JSON object with resourceSpans")
    try:
        hex_ids_to_base64(document)
        return json_format.ParseDict(document, ExportTraceServiceRequest(), ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, ValueError, AttributeError) as exc:
        raise BadRequest(400, f"not an OTLP ExportTraceServiceRequest: {exc}") from None


def convert_protobuf_body(body: bytes, received_at_ns: int) -> ConversionResult:
    """Convert a serialized ``ExportTraceServiceRequest``; :class:`BadRequest` (400) if malformed."""
    try:
        return body_to_table(body, received_at_ns)
    except DecodeError as exc:
        raise BadRequest(400, f"body is not a valid OTLP protobuf ExportTraceServiceRequest: {exc}") from None


def gunzip(body: bytes, limit: int) -> bytes:
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        data = decompressor.decompress(body, limit + 1)
    except zlib.error as exc:
        raise BadRequest(400, f"body is not valid gzip: {exc}") from None
    if len(data) > limit or decompressor.unconsumed_tail:
        raise BadRequest(413, f"decompressed body is over the {limit}-byte limit")
    if not decompressor.eof:
        raise BadRequest(400, "gzip body is truncated")
    return data


def export_response(result: ConversionResult | None) -> ExportTraceServiceResponse:
    response = ExportTraceServiceResponse()
    if result is not None and result.rejected:
        response.partial_success.rejected_spans = result.rejected
        response.partial_success.error_message = "; ".join(result.errors)
    return response


class OtlpHttpHandler:
    """Answers OTLP/HTTP requests (see the module docstring) into an :class:`Ingestor`."""

    def __init__(self, ingestor: Ingestor, *, token: str | None = None, max_request_bytes: int) -> None:
        self.ingestor = ingestor
        self.token = token
        self.max_request_bytes = max_request_bytes
        self.started = time.time()
        self._waiting: list[tuple[bytes, asyncio.Future[ExportTraceServiceResponse]]] = []
        self._accept_scheduled = False
        self._in_flight = 0  # conversions submitted whose WAL write has not been answered yet

    def admit(self, request: Request) -> Response | None:
        """Everything decided by the head: routes, method, token, content type, declared size, capacity."""
        if request.path in HEALTH_PATHS:
            return self._health()
        if request.path != TRACES_PATH:
            return Response(404, _json_status(404, f"no route {request.path}; use POST {TRACES_PATH}"), JSON)
        try:
            if request.method != "POST":
                raise BadRequest(405, f"use POST for {TRACES_PATH}", [(b"allow", b"POST")])
            self._authorize(request.headers)
            content_type = _content_type(request)
            if content_type != JSON_TYPE and content_type not in PROTOBUF_TYPES:
                raise BadRequest(
                    415, f"unsupported content type {content_type!r}; use {PROTOBUF_TYPES[0]} or {JSON_TYPE}"
                )
            declared, limit = request.content_length, self.max_request_bytes
            if declared is not None and declared > limit:
                raise BadRequest(413, f"body of {declared} bytes is over the {limit}-byte limit")
            self.ingestor.check_capacity()
        except (BadRequest, Overloaded, Unavailable) as exc:
            return _error(request, exc)
        return None

    def body_too_large(self, request: Request) -> Response:
        return _error(request, BadRequest(413, f"body is over the {self.max_request_bytes}-byte limit"))

    async def respond(self, request: Request) -> Response:
        use_json = _content_type(request) == JSON_TYPE
        try:
            body = self._decoded_body(request)
            payload = parse_json_request(body).SerializeToString() if use_json else body
            response = await self._accept(payload)
        except (BadRequest, Overloaded, Unavailable) as exc:
            return _error(request, exc)
        if use_json:
            return Response(200, json_format.MessageToJson(response, indent=None).encode(), JSON)
        return Response(200, response.SerializeToString(), PROTOBUF)

    async def _accept(self, payload: bytes) -> ExportTraceServiceResponse:
        """Convert and durably queue one request, together with the others waiting (see
        :meth:`_accept_waiting`); the answer comes once it is in the WAL."""
        answer: asyncio.Future[ExportTraceServiceResponse] = asyncio.get_running_loop().create_future()
        self._waiting.append((payload, answer))
        self._schedule_accept()
        return await answer

    def _schedule_accept(self) -> None:
        """Accept the waiting requests in the next event-loop turn, unless CONVERSIONS_AHEAD earlier
        conversions still wait for the WAL: requests arriving meanwhile are logged after that write
        anyway, so they wait for it and are then converted as one (fewer, larger conversions)."""
        if self._accept_scheduled or not self._waiting:
            return
        waiting_bytes = sum(len(payload) for payload, _ in self._waiting)
        if self._in_flight >= CONVERSIONS_AHEAD and waiting_bytes < BATCH_BYTES:  # the pipeline is full
            return
        self._accept_scheduled = True
        asyncio.get_running_loop().call_soon(self._accept_waiting)

    def _accept_waiting(self) -> None:
        """Accept the waiting requests, converted as one when they can be.

        Protobuf concatenation is a merge (the ``resource_spans`` of each request follow each other), so
        requests that are whole field sequences convert as one body: the conversion's cost per request
        (~1 ms of Python and Arrow calls, most of the CPU for small requests) is paid once per batch,
        and one table goes to the WAL and the writer. A batch that any request would make fail, or
        that has rejected spans to report, is converted request by request instead, as a single one is.
        """
        waiting, self._waiting = self._waiting, []
        self._accept_scheduled = False
        try:
            self._accept_batch(waiting)
        except Exception as exc:  # a bug, not bad input: answer 500 rather than leave clients waiting
            log.exception("accepting %d request(s) failed", len(waiting))
            for _, answer in waiting:
                if not answer.done():
                    answer.set_exception(exc)

    def _accept_batch(self, waiting: list[tuple[bytes, asyncio.Future[ExportTraceServiceResponse]]]) -> None:
        received = time.time_ns()
        payloads = [payload for payload, _ in waiting]
        if len(waiting) > 1 and all(map(_whole_fields, payloads)):
            try:
                merged = body_to_table(b"".join(payloads), received)
            except DecodeError:
                merged = None
            if merged is not None and not merged.rejected:
                self._queue(payloads, merged, received, [answer for _, answer in waiting])
                return
        for payload, answer in waiting:
            try:
                result = convert_protobuf_body(payload, received)
            except BadRequest as exc:
                answer.set_exception(exc)
                continue
            self._queue([payload], result, received, [answer])

    def _queue(
        self,
        payloads: list[bytes],
        result: ConversionResult,
        received: int,
        answers: list[asyncio.Future[ExportTraceServiceResponse]],
    ) -> None:
        """Submit to the ingestor; resolve ``answers`` once the WAL has the requests (or with the error)."""
        try:
            logged = asyncio.wrap_future(self.ingestor.submit(payloads, result, received))
        except (Overloaded, Unavailable) as exc:
            logged = asyncio.get_running_loop().create_future()
            logged.set_exception(exc)
        response = export_response(result)

        def answer(logged: asyncio.Future[None]) -> None:
            self._in_flight -= 1
            self._schedule_accept()
            error = logged.exception()
            for waiter in answers:
                if waiter.done():  # its client went away
                    continue
                if error is not None:
                    waiter.set_exception(error)
                else:
                    waiter.set_result(response)

        self._in_flight += 1
        logged.add_done_callback(answer)

    def _authorize(self, headers: dict[bytes, bytes]) -> None:
        if self.token is None:
            return
        given = headers.get(b"authorization", b"")
        expected = b"Bearer " + self.token.encode()
        if not hmac.compare_digest(given, expected):
            reason = "missing" if not given else "wrong"
            raise BadRequest(401, f"{reason} bearer token", [(b"www-authenticate", b"Bearer")])

    def _decoded_body(self, request: Request) -> bytes:
        encoding = request.headers.get(b"content-encoding", b"identity").strip().lower()
        if encoding == b"gzip":
            return gunzip(request.body, self.max_request_bytes)
        if encoding not in (b"identity", b""):
            raise BadRequest(415, f"unsupported content encoding {encoding.decode('latin-1')!r}; use gzip")
        return request.body

    def _health(self) -> Response:
        ingestor = self.ingestor
        healthy = ingestor.failure is None
        document = {
            "status": "ok" if healthy else "failed",
            "failure": ingestor.failure,
            "uptime_s": round(time.time() - self.started, 1),
            "pending_bytes": ingestor.pending_bytes,
            **ingestor.stats,
        }
        return Response(200 if healthy else 503, json.dumps(document).encode(), JSON)


def _whole_fields(body: bytes) -> bool:
    """Whether ``body`` is a run of complete top-level protobuf fields: then, concatenated with other
    requests, none of its bytes can be read as part of theirs, nor theirs as part of it."""
    pos, end = 0, len(body)
    while pos < end:
        tag, pos = read_varint(body, pos)
        wire = tag & 7
        if wire == 0:
            pos = read_varint(body, pos)[1]
        elif wire == 2:
            length, pos = read_varint(body, pos)
            pos += length
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            return False
    return pos == end


def _content_type(request: Request) -> str:
    return request.headers.get(b"content-type", b"").split(b";")[0].strip().decode("latin-1").lower()


def _error(request: Request, exc: BadRequest | Overloaded | Unavailable) -> Response:
    """The error answer in the request's encoding: a ``google.rpc.Status`` as JSON or protobuf."""
    if isinstance(exc, Overloaded):
        status, headers = 429, [(b"retry-after", str(exc.retry_after_s).encode())]
    elif isinstance(exc, Unavailable):
        status, headers = 503, [(b"retry-after", b"5")]
    else:
        status, headers = exc.status, exc.headers
    if _content_type(request) == JSON_TYPE:
        return Response(status, _json_status(status, str(exc)), JSON, headers)
    body = status_pb2.Status(code=_grpc_code(status), message=str(exc)).SerializeToString()
    return Response(status, body, PROTOBUF, headers)


def _grpc_code(http_status: int) -> int:
    return {400: 3, 401: 16, 404: 5, 405: 12, 413: 8, 415: 3, 429: 8, 503: 14}.get(http_status, 2)


def _json_status(status: int, message: str) -> bytes:
    return json.dumps({"code": _grpc_code(status), "message": message}).encode()
