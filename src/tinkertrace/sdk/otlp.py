"""A ``SpanExporter`` sending OTLP to an endpoint without ever losing or blocking on spans.

A batch the endpoint cannot take right now (connection refused, timeout, 408/429/5xx, gRPC
UNAVAILABLE) is written to a :class:`~tinkertrace.sdk.spool.Spool` and re-sent, oldest first, by a
background thread until it is accepted; processes sharing the spool claim each batch before re-sending
it, and a later process with the same endpoint picks up what is left. A batch the endpoint refuses
(any other 4xx, e.g. 400, 401, 413; gRPC INVALID_ARGUMENT), on its first try or a re-send, is kept in
``rejected/``, counted as rejected, and makes the next ``flush()`` return False.

Delivery is at least once, as OTLP's is: a request that got no answer (a timeout while waiting for
it, the connection lost after sending) may have been stored, and it is re-sent all the same (losing
training data is worse). Such spans are counted in ``spans_in_doubt``: they are the only ones the
endpoint can have stored twice, and the builder counts a span delivered twice once.
"""

from __future__ import annotations

import enum
import http.client
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from tinkertrace.sdk.config import TraceSettings
from tinkertrace.sdk.export import encode_batch
from tinkertrace.sdk.spool import Spool
from tinkertrace.sdk.stats import ExportStats

log = logging.getLogger("tinkertrace")

_RETRYABLE_HTTP = {408, 429, 500, 502, 503, 504}


class Outcome(enum.Enum):
    SENT = "sent"
    RETRY = "retry"  # not taken (nothing listening, 408/429/5xx): re-sent later
    UNANSWERED = "unanswered"  # sent but no answer came: re-sent later, maybe stored already
    REJECTED = "rejected"


_RESEND = {Outcome.RETRY, Outcome.UNANSWERED}


class HttpSender:
    """POST ``application/x-protobuf`` to an OTLP/HTTP ``/v1/traces`` URL over one kept-alive connection.

    The standard library's ``http.client``, not httpx: the SDK then never imports httpx on the export
    thread (the OpenAI client 3.x reads ``sys.modules["httpx"]`` on every request, and a half-imported
    httpx there fails the agent's calls)."""

    def __init__(self, url: str, headers: Mapping[str, str], timeout_s: float) -> None:
        self.url = url
        parts = urlsplit(url)
        self._https = parts.scheme == "https"
        self._address = (parts.hostname or "127.0.0.1", parts.port)
        self._path = parts.path + (f"?{parts.query}" if parts.query else "")
        self._headers = {"Content-Type": "application/x-protobuf", **headers}
        self._timeout_s = timeout_s
        self._conn: http.client.HTTPConnection | None = None

    def send(self, payload: bytes) -> tuple[Outcome, int]:
        """``(outcome, spans the endpoint rejected in a partial success)``."""
        reused = self._conn is not None
        try:
            conn = self._connect()
        except OSError as exc:  # refused, unreachable, timed out connecting: nothing was sent
            log.debug("tinkertrace: OTLP export to %s failed: %s", self.url, exc)
            return Outcome.RETRY, 0
        try:
            conn.request("POST", self._path, body=payload, headers=self._headers)
            resp = conn.getresponse()
            body = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            if reused and isinstance(
                exc, http.client.RemoteDisconnected | BrokenPipeError | ConnectionResetError
            ):
                return self.send(payload)  # the endpoint closed the idle connection: once more on a new one
            log.debug("tinkertrace: OTLP export to %s got no answer: %s", self.url, exc)
            return Outcome.UNANSWERED, 0
        if resp.status in _RETRYABLE_HTTP:
            return Outcome.RETRY, 0
        if resp.status >= 400:
            text = body[:200].decode("utf-8", "replace")
            log.warning("tinkertrace: %s refused a batch: %s %s", self.url, resp.status, text)
            return Outcome.REJECTED, 0
        rejected = 0
        if body and "protobuf" in (resp.getheader("content-type") or ""):
            try:
                from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
                    ExportTraceServiceResponse,  # here, not at init: its protobuf classes load in ~45 ms
                )

                rejected = ExportTraceServiceResponse.FromString(body).partial_success.rejected_spans
            except Exception:  # a malformed reply still means the batch was taken
                rejected = 0
        return Outcome.SENT, int(rejected)

    def _connect(self) -> http.client.HTTPConnection:
        if self._conn is None:
            host, port = self._address
            if self._https:
                import ssl  # here: a default SSL context costs ~40 ms

                conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                    host, port, timeout=self._timeout_s, context=ssl.create_default_context()
                )
            else:
                conn = http.client.HTTPConnection(host, port, timeout=self._timeout_s)
            conn.connect()
            self._conn = conn
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class GrpcSender:
    """Call ``TraceService/Export`` on an OTLP/gRPC endpoint (insecure channel, 64 MiB messages)."""

    METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"

    def __init__(self, target: str, headers: Mapping[str, str], timeout_s: float) -> None:
        import grpc

        self.url = target
        self._timeout = timeout_s
        self._metadata = tuple((k.lower(), v) for k, v in headers.items())
        limit = 64 * 1024 * 1024
        self._channel = grpc.insecure_channel(
            target,
            options=[("grpc.max_send_message_length", limit), ("grpc.max_receive_message_length", limit)],
        )
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

        self._call = self._channel.unary_unary(
            self.METHOD, request_serializer=None, response_deserializer=ExportTraceServiceResponse.FromString
        )

    def send(self, payload: bytes) -> tuple[Outcome, int]:
        import grpc

        try:
            reply = self._call(payload, timeout=self._timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                log.warning("tinkertrace: %s refused a batch: %s", self.url, exc)
                return Outcome.REJECTED, 0
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:  # the endpoint may still store it
                return Outcome.UNANSWERED, 0
            return Outcome.RETRY, 0
        return Outcome.SENT, int(reply.partial_success.rejected_spans)

    def close(self) -> None:
        self._channel.close()


class OtlpSpoolingExporter(SpanExporter):
    """Export to an OTLP endpoint; spool what fails and re-send it from a background thread."""

    def __init__(
        self,
        url: str,
        protocol: str,
        spool_dir: Path,
        stats: ExportStats | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 5.0,
        retry_interval_s: float = 2.0,
    ) -> None:
        sender_type = GrpcSender if protocol == "grpc" else HttpSender
        self._sender = sender_type(url, headers or {}, timeout_s)
        self.spool = Spool(spool_dir)
        self._stats = stats if stats is not None else ExportStats()
        self._interval = retry_interval_s
        self._drain_lock = threading.Lock()
        self._refused_batches = 0  # refused since the last flush(): that flush returns False
        self._refused_lock = threading.Lock()
        self.spool.release_stale_claims()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._retry_loop, name="tinkertrace-spool", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: TraceSettings, stats: ExportStats) -> OtlpSpoolingExporter:
        """The exporter to ``config``'s endpoint (its URL, protocol, spool, headers and timings)."""
        assert config.otlp_url is not None and config.spool_dir is not None
        return cls(
            config.otlp_url,
            config.protocol,
            config.spool_dir,
            stats,
            headers=config.headers,
            timeout_s=config.export_timeout_s,
            retry_interval_s=config.retry_interval_s,
        )

    def __repr__(self) -> str:
        return f"OtlpSpoolingExporter({self._sender.url!r})"

    def _account(self, outcome: Outcome, rejected: int, n_spans: int, *, resent: bool) -> None:
        if outcome is Outcome.SENT:
            self._stats.add("spans_resent" if resent else "spans_exported", n_spans - rejected)
            if resent:
                self._stats.add("spans_exported", n_spans - rejected)
            if rejected:
                self._stats.add("spans_rejected", rejected)
        elif outcome is Outcome.REJECTED:
            self._stats.add("spans_rejected", n_spans)
        if rejected or outcome is Outcome.REJECTED:
            with self._refused_lock:
                self._refused_batches += 1

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Send the batch now, or keep it in the spool (a success: it is re-sent until delivered)."""
        request = encode_batch(spans, self._stats)
        if request is None:
            return SpanExportResult.FAILURE
        return self.export_payload(request.SerializeToString(), len(spans))

    def export_payload(self, payload: bytes, n_spans: int) -> SpanExportResult:
        """:meth:`export` for a batch already encoded (an ``ExportTraceServiceRequest`` of ``n_spans``):
        sent now, or kept in the spool (fsynced) to be re-sent."""
        if not self.spool.pending():
            outcome, rejected = self._sender.send(payload)
            if outcome is Outcome.REJECTED:
                self.spool.put_rejected(payload, n_spans)
            if outcome not in _RESEND:
                self._account(outcome, rejected, n_spans, resent=False)
                return SpanExportResult.FAILURE if outcome is Outcome.REJECTED else SpanExportResult.SUCCESS
            self._stats.add("export_errors")
            if outcome is Outcome.UNANSWERED:
                self._stats.add("spans_in_doubt", n_spans)
        self.spool.put(payload, n_spans)
        self._stats.add("spans_spooled", n_spans)
        return SpanExportResult.SUCCESS

    def drain(self, deadline: float | None = None) -> bool:
        """Re-send spooled payloads oldest first until one fails; True when none is left unclaimed.

        Each payload is claimed first: one another process claimed is skipped (it re-sends it)."""
        with self._drain_lock:
            for path in self.spool.pending():
                if deadline is not None and time.monotonic() > deadline:
                    return False
                claimed = self.spool.claim(path)
                if claimed is None:
                    continue
                try:
                    outcome, rejected = self._sender.send(claimed.read_bytes())
                except BaseException:
                    self.spool.release(claimed)
                    raise
                if outcome in _RESEND:
                    if outcome is Outcome.UNANSWERED:
                        self._stats.add("spans_in_doubt", Spool.span_count(claimed))
                    self.spool.release(claimed)
                    return False
                self._account(outcome, rejected, Spool.span_count(claimed), resent=True)
                if outcome is Outcome.REJECTED:
                    self.spool.reject(claimed)
                else:
                    claimed.unlink(missing_ok=True)
            return True

    def _retry_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._stop.is_set():
                return
            if self.spool.pending() or self.spool.release_stale_claims():
                time.sleep(min(0.05, self._interval))  # let a burst of failures settle first
                try:
                    self.drain()
                except Exception:
                    log.exception("tinkertrace: re-sending spooled spans failed")

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Re-send the spool, retrying until it is empty or the timeout has passed. False if batches
        are still spooled, or if the endpoint refused any batch since the last flush (kept in
        ``rejected/``)."""
        deadline = time.monotonic() + timeout_millis / 1000
        while not self.drain(deadline):
            if time.monotonic() + 0.2 > deadline:
                return False
            time.sleep(0.2)
        with self._refused_lock:
            refused, self._refused_batches = self._refused_batches, 0
        if refused:
            log.warning(
                "tinkertrace: %s refused %d span batch(es) since the last flush; kept in %s",
                self._sender.url,
                refused,
                self.spool.rejected_dir,
            )
        return not refused

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)
        try:
            self.drain(time.monotonic() + 2)
        finally:
            left = self.spool.pending()
            if left:
                log.warning(
                    "tinkertrace: %d span batches could not be delivered to %s; they stay in %s and are "
                    "re-sent by the next process using this endpoint",
                    len(left),
                    self._sender.url,
                    self.spool.root,
                )
            self._sender.close()
