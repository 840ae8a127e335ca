"""OTLP/gRPC receiver: ``opentelemetry.proto.collector.trace.v1.TraceService/Export``.

The method is registered with raw-bytes request handling so the exact bytes go to the WAL without
re-serialising. Overload answers RESOURCE_EXHAUSTED with a ``google.rpc.RetryInfo`` trailer (which
the OTel exporters honour); shutdown or storage failure answers UNAVAILABLE.
"""

from __future__ import annotations

import hmac
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
from google.protobuf.duration_pb2 import Duration
from google.rpc import error_details_pb2

from tinkertrace.collector.ingest import Ingestor, Overloaded, Unavailable
from tinkertrace.collector.otlp_http import BadRequest, convert_protobuf_body, export_response

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


class _Export:
    def __init__(self, ingestor: Ingestor, token: str | None) -> None:
        self.ingestor = ingestor
        self.expected = None if token is None else "Bearer " + token

    def __call__(self, body: bytes, context: grpc.ServicerContext) -> bytes:
        if self.expected is not None:
            given = dict(context.invocation_metadata()).get("authorization", "")
            if not hmac.compare_digest(str(given), self.expected):
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        try:
            self.ingestor.check_capacity()
            received = time.time_ns()
            result = convert_protobuf_body(body, received)
            self.ingestor.submit([body], result, received).result()
        except BadRequest as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Overloaded as exc:
            info = error_details_pb2.RetryInfo(retry_delay=Duration(seconds=exc.retry_after_s))
            context.set_trailing_metadata((("google.rpc.retryinfo-bin", info.SerializeToString()),))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except Unavailable as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        return export_response(result).SerializeToString()


def start_grpc_server(
    ingestor: Ingestor, host: str, port: int, *, token: str | None, max_request_bytes: int, workers: int = 8
) -> grpc.Server:
    """Start (and return) a gRPC server exporting TraceService/Export on ``host:port``."""
    server = grpc.server(
        ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tt-grpc"),
        options=[
            ("grpc.max_receive_message_length", max_request_bytes),
            ("grpc.max_send_message_length", 16 * 1024 * 1024),
        ],
        maximum_concurrent_rpcs=workers * 4,
    )
    handler = grpc.unary_unary_rpc_method_handler(_Export(ingestor, token))  # raw bytes in and out
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Export": handler}),))
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise OSError(f"cannot listen for OTLP/gRPC on {host}:{port}")
    server.start()
    return server
