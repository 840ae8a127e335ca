"""OTLP/HTTP receiver: ``POST /v1/traces`` and ``POST /v1/logs`` (protobuf or JSON, optional gzip),
served by :mod:`.http_server`.

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
from google.protobuf.message import Message
from google.rpc import status_pb2
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tinkertrace.collector.http_server import Request, Response
from tinkertrace.collector.ingest import Ingestor, Overloaded, Unavailable
from tinkertrace.collector.pipeline import LOGS, IngestPipeline, InternalError, InvalidRequest

log = logging.getLogger("tinkertrace.collector")

TRACES_PATH = "/v1/traces"
LOGS_PATH = "/v1/logs"
HEALTH_PATHS = ("/health", "/healthz")
PROTOBUF_TYPES = ("application/x-protobuf", "application/protobuf")
JSON_TYPE = "application/json"
JSON, PROTOBUF = JSON_TYPE.encode(), PROTOBUF_TYPES[0].encode()  # response content types


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
    for r_index, resource_logs in enumerate(document.get("resourceLogs") or []):
        for scope_logs in resource_logs.get("scopeLogs") or []:
            for l_index, record in enumerate(scope_logs.get("logRecords") or []):
                _convert_ids(record, f"resourceLogs[{r_index}] logRecords[{l_index}]")


def _convert_ids(holder: dict[str, Any], where: str) -> None:
    for key in ("traceId", "spanId", "parentSpanId"):
        value = holder.get(key)
        if isinstance(value, str) and value:
            try:
                holder[key] = binascii.b2a_base64(bytes.fromhex(value), newline=False).decode()
            except ValueError:
                raise BadRequest(400, f"{where}: {key} {value!r} is not hex") from None


def parse_json_request(body: bytes, message: type[Message] = ExportTraceServiceRequest) -> Message:
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(400, f"body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest(400, "body is not valid JSON: nested too deeply") from None
    if not isinstance(document, dict):
        raise BadRequest(400, "body must be a JSON object with resourceSpans (or resourceLogs)")
    name = message.DESCRIPTOR.name
    try:
        hex_ids_to_base64(document)
        return json_format.ParseDict(document, message(), ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, ValueError, AttributeError) as exc:
        raise BadRequest(400, f"not an OTLP {name}: {exc}") from None
    except RecursionError:
        raise BadRequest(400, f"JSON body is nested too deeply for an {name}") from None


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


class OtlpHttpHandler:
    """Answers OTLP/HTTP requests (see the module docstring) through an :class:`IngestPipeline` per
    signal: spans to ``ingestor``, log records to ``logs`` (when given; else ``/v1/logs`` is 404)."""

    def __init__(
        self,
        ingestor: Ingestor,
        *,
        logs: Ingestor | None = None,
        token: str | None = None,
        max_request_bytes: int,
    ) -> None:
        self.ingestor = ingestor
        self.pipeline = IngestPipeline(ingestor)
        self.routes: dict[str, tuple[Ingestor, IngestPipeline, type[Message]]] = {
            TRACES_PATH: (ingestor, self.pipeline, ExportTraceServiceRequest)
        }
        if logs is not None:
            self.routes[LOGS_PATH] = (logs, IngestPipeline(logs, LOGS), ExportLogsServiceRequest)
        self.token = token
        self.max_request_bytes = max_request_bytes
        self.started = time.time()

    def admit(self, request: Request) -> Response | None:
        """Everything decided by the head: routes, method, token, content type, declared size, capacity.
        An admitted request holds its declared size of the memory budget (``request.reserved``)."""
        if request.path in HEALTH_PATHS:
            health = self.health()
            return Response(200 if health["status"] == "ok" else 503, json.dumps(health).encode(), JSON)
        route = self.routes.get(request.path)
        if route is None:
            paths = " or ".join(self.routes)
            return Response(404, _json_status(404, f"no route {request.path}; use POST {paths}"), JSON)
        try:
            if request.method != "POST":
                raise BadRequest(405, f"use POST for {request.path}", [(b"allow", b"POST")])
            self._authorize(request.headers)
            content_type = _content_type(request)
            if content_type != JSON_TYPE and content_type not in PROTOBUF_TYPES:
                raise BadRequest(
                    415, f"unsupported content type {content_type!r}; use {PROTOBUF_TYPES[0]} or {JSON_TYPE}"
                )
            declared, limit = request.content_length, self.max_request_bytes
            if declared is not None and declared > limit:
                raise BadRequest(413, f"body of {declared} bytes is over the {limit}-byte limit")
            request.reserved = route[0].admit(declared or 0)
        except (BadRequest, Overloaded, Unavailable) as exc:
            return _error(request, exc)
        return None

    def abandon(self, request: Request) -> None:
        """The connection of an admitted request went away before its body was complete."""
        self.routes[request.path][0].budget.release(request.reserved)
        request.reserved = 0

    def body_too_large(self, request: Request) -> Response:
        return _error(request, BadRequest(413, f"body is over the {self.max_request_bytes}-byte limit"))

    async def respond(self, request: Request) -> Response:
        use_json = _content_type(request) == JSON_TYPE
        reserved, request.reserved = request.reserved, 0
        ingestor, pipeline, message = self.routes[request.path]
        try:
            try:
                body = self._decoded_body(request)
                payload = parse_json_request(body, message).SerializeToString() if use_json else body
            except BaseException:
                ingestor.budget.release(reserved)
                raise
            response = await asyncio.wrap_future(pipeline.accept(payload, reserved=reserved))
        except (BadRequest, InvalidRequest, InternalError, Overloaded, Unavailable) as exc:
            return _error(request, exc)
        if use_json:
            return Response(200, json_format.MessageToJson(response, indent=None).encode(), JSON)
        return Response(200, response.SerializeToString(), PROTOBUF)

    def _authorize(self, headers: dict[bytes, bytes]) -> None:
        if self.token is None:
            return
        given = headers.get(b"authorization", b"")
        if not bearer_matches(given, self.token.encode()):
            reason = "missing" if not given else "wrong"
            raise BadRequest(401, f"{reason} bearer token", [(b"www-authenticate", b"Bearer")])

    def _decoded_body(self, request: Request) -> bytes:
        encoding = request.headers.get(b"content-encoding", b"identity").strip().lower()
        if encoding == b"gzip":
            return gunzip(request.body, self.max_request_bytes)
        if encoding not in (b"identity", b""):
            raise BadRequest(415, f"unsupported content encoding {encoding.decode('latin-1')!r}; use gzip")
        return request.body

    def health(self) -> dict[str, Any]:
        """The ``/health`` document: status (``ok``, ``recovering`` or ``failed``), what happened, counts."""
        return {
            **self.ingestor.health(),
            "uptime_s": round(time.time() - self.started, 1),
        }


def bearer_matches(authorization: bytes, token: bytes) -> bool:
    """Whether an ``Authorization`` value carries ``token`` with the Bearer scheme (its name is
    case-insensitive, RFC 7235), compared in constant time."""
    scheme, _, given = authorization.strip().partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), token)


def _content_type(request: Request) -> str:
    return request.headers.get(b"content-type", b"").split(b";")[0].strip().decode("latin-1").lower()


def _error(request: Request, exc: Exception) -> Response:
    """The error answer in the request's encoding: a ``google.rpc.Status`` as JSON or protobuf."""
    if isinstance(exc, Overloaded):
        status, headers = 429, [(b"retry-after", str(exc.retry_after_s).encode())]
    elif isinstance(exc, Unavailable):
        status, headers = 503, [(b"retry-after", b"5")]
    elif isinstance(exc, InvalidRequest):
        status, headers = 400, []
    elif isinstance(exc, InternalError):
        status, headers = 500, []
    else:
        assert isinstance(exc, BadRequest)
        status, headers = exc.status, exc.headers
    if _content_type(request) == JSON_TYPE:
        return Response(status, _json_status(status, str(exc)), JSON, headers)
    body = status_pb2.Status(code=_grpc_code(status), message=str(exc)).SerializeToString()
    return Response(status, body, PROTOBUF, headers)


def _grpc_code(http_status: int) -> int:
    codes = {400: 3, 401: 16, 404: 5, 405: 12, 408: 4, 413: 8, 415: 3, 429: 8, 500: 13, 503: 14}
    return codes.get(http_status, 2)


def _json_status(status: int, message: str) -> bytes:
    return json.dumps({"code": _grpc_code(status), "message": message}).encode()
