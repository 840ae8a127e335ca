"""The front of the ingest pipeline that both transports (OTLP/HTTP and OTLP/gRPC) hand raw requests to.

Each request is validated and converted on its own, in the calling thread: what one request holds
decides only that request's answer. An empty request (0 bytes, e.g. from JSON ``{}``) is answered
at once and logs nothing; a request that cannot be read is :class:`InvalidRequest` (HTTP 400, gRPC
INVALID_ARGUMENT); spans with bad values are dropped and reported in ``partial_success``; anything
unforeseen inside one conversion is :class:`InternalError` for that request only. Only requests that
converted cleanly reach the :class:`~tinkertrace.collector.ingest.Ingestor`, whose WAL thread then
commits whatever is queued together (one fsync for many requests, from either transport).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from tinkertrace.collector.ingest import Ingestor
from tinkertrace.futures import map_future
from tinkertrace.spanstore.convert import ConversionResult, body_to_table
from tinkertrace.spanstore.logs import convert_logs

log = logging.getLogger("tinkertrace.collector")

# what reading a malformed request can raise (protobuf, the reference decoder's value checks, Arrow's
# UTF-8 validation, nesting deeper than the parser allows)
_INPUT_ERRORS = (
    DecodeError, ValueError, TypeError, OverflowError, IndexError, RecursionError, pa.ArrowInvalid
)  # fmt: skip


class InvalidRequest(Exception):
    """The request cannot be read; the client must not retry it (HTTP 400, gRPC INVALID_ARGUMENT)."""


class InternalError(Exception):
    """Converting this request met a bug (HTTP 500, gRPC INTERNAL); other requests are unaffected."""


@dataclass(frozen=True)
class Signal:
    """What one OTLP signal's requests are: the converter into its table, the answer, the names."""

    name: str  # "traces" or "logs"
    request_type: str  # the protobuf message a request body is
    convert: Callable[[bytes, int], ConversionResult]
    response_type: type[Message]  # the protobuf message of the answer
    rejected_field: str  # its partial_success field counting what was dropped

    def respond(self, result: ConversionResult | None) -> Message:
        """The OTLP answer: empty, or ``partial_success`` naming what was dropped and why."""
        response = self.response_type()
        if result is not None and result.rejected:
            setattr(response.partial_success, self.rejected_field, result.rejected)
            response.partial_success.error_message = "; ".join(result.errors)
        return response


# body_to_table looked up at each call: the module's name is the seam tests patch
TRACES = Signal(
    "traces",
    "ExportTraceServiceRequest",
    lambda b, t: body_to_table(b, t),
    ExportTraceServiceResponse,
    "rejected_spans",
)
LOGS = Signal(
    "logs", "ExportLogsServiceRequest", convert_logs, ExportLogsServiceResponse, "rejected_log_records"
)


def convert_request(payload: bytes, received_at_ns: int, signal: Signal = TRACES) -> ConversionResult:
    """Convert one serialized request of ``signal`` (``ExportTraceServiceRequest`` by default);
    :class:`InvalidRequest` if it is malformed, :class:`InternalError` if the conversion fails for
    another reason."""
    try:
        return signal.convert(payload, received_at_ns)
    except _INPUT_ERRORS as exc:
        raise InvalidRequest(f"body is not a valid OTLP protobuf {signal.request_type}: {exc}") from None
    except Exception as exc:
        log.exception("converting a %d-byte request failed", len(payload))
        raise InternalError(f"internal error converting the request: {exc!r}") from None


class IngestPipeline:
    """Takes raw requests from any transport, thread-safe; see the module docstring."""

    def __init__(self, ingestor: Ingestor, signal: Signal = TRACES) -> None:
        self.ingestor = ingestor
        self.signal = signal

    def accept(self, payload: bytes, *, reserved: int = 0) -> Future[Any]:
        """Convert ``payload`` and queue it; the future resolves once it is in the WAL (or with
        ``Overloaded``/``Unavailable``). ``reserved`` bytes of the memory budget, taken when the body
        was admitted, pass to the queued request (or are given back). Raises :class:`InvalidRequest`,
        :class:`InternalError`, ``Overloaded`` or ``Unavailable`` for this request alone."""
        budget = self.ingestor.budget
        try:
            received = time.time_ns()
            if not payload:  # protobuf's encoding of an empty request: nothing to log
                self.ingestor.count_request()
                return _done(self.signal.respond(None))
            result = convert_request(payload, received, self.signal)
            logged = self.ingestor.submit(payload, result, received, reserved=reserved)
        except BaseException:
            budget.release(reserved)
            raise
        response = self.signal.respond(result)
        return map_future(logged, lambda _: response)


def _done(response: Any) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_result(response)
    return future
