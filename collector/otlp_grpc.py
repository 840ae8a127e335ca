"""OTLP/gRPC receiver: ``opentelemetry.proto.collector.trace.v1.TraceService/Export`` (and
``...logs.v1.LogsService/Export`` when the collector keeps logs).

The method is registered with raw-bytes request handling so the exact bytes go to the ingest pipeline
(and the WAL) without re-serialising. Overload answers RESOURCE_EXHAUSTED with a
``google.rpc.RetryInfo`` trailer (which the OTel exporters honour); shutdown or storage failure
answers UNAVAILABLE.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
from google.protobuf.duration_pb2 import Duration
from google.rpc import error_details_pb2

from tinkertrace.collector.ingest import Ingestor, Overloaded, Unavailable
from tinkertrace.collector.otlp_http import bearer_matches
from tinkertrace.collector.pipeline import LOGS, TRACES, IngestPipeline, InternalError, InvalidRequest, Signal

SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"


class _Export:
    def __init__(self, ingestor: Ingestor, token: str | None, signal: Signal = TRACES) -> None:
        self.ingestor = ingestor
        self.pipeline = IngestPipeline(ingestor, signal)
        self.token = None if token is None else token.encode()

    def __call__(self, body: bytes, context: grpc.ServicerContext) -> bytes:
        if self.token is not None:
            given = str(dict(context.invocation_metadata()).get("authorization", ""))
            if not bearer_matches(given.encode(), self.token):
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
        try:
            # grpcio has received the whole message by now: it counts against the budget from here
            reserved = self.ingestor.admit(len(body))
            response = self.pipeline.accept(body, reserved=reserved).result()
        except InvalidRequest as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except InternalError as exc:
            context.abort(grpc.StatusCode.INTERNAL, str(exc))
        except Overloaded as exc:
            info = error_details_pb2.RetryInfo(retry_delay=Duration(seconds=exc.retry_after_s))
            context.set_trailing_metadata((("google.rpc.retryinfo-bin", info.SerializeToString()),))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        except Unavailable as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        return response.SerializeToString()


def start_grpc_server(
    ingestor: Ingestor,
    host: str,
    port: int,
    *,
    token: str | None,
    max_request_bytes: int,
    workers: int = 8,
    logs: Ingestor | None = None,
) -> grpc.Server:
    """Start (and return) a gRPC server exporting TraceService/Export (and LogsService/Export into
    ``logs`` when given) on ``host:port``."""
    server = grpc.server(
        ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tt-grpc"),
        options=[
            ("grpc.max_receive_message_length", max_request_bytes),
            ("grpc.max_send_message_length", 16 * 1024 * 1024),
        ],
        maximum_concurrent_rpcs=workers * 4,
    )
    handler = grpc.unary_unary_rpc_method_handler(_Export(ingestor, token))  # raw bytes in and out
    handlers = [grpc.method_handlers_generic_handler(SERVICE, {"Export": handler})]
    if logs is not None:
        logs_handler = grpc.unary_unary_rpc_method_handler(_Export(logs, token, LOGS))
        handlers.append(grpc.method_handlers_generic_handler(LOGS_SERVICE, {"Export": logs_handler}))
    server.add_generic_rpc_handlers(tuple(handlers))
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise OSError(f"cannot listen for OTLP/gRPC on {host}:{port}")
    server.start()
    return server
