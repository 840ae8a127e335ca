"""OTLP trace requests → Arrow tables of the ``spans`` schema: :func:`request_to_table` and
:func:`body_to_table` are the entry points.

Two decoders stand behind them:

- ``reference`` defines the semantics (which spans are rejected, with which message; what each
  attribute and event becomes, in ``values``) and takes every valid encoding, in Python per span.
- ``compiled`` (with the numba kernels in ``compiled_kernels``; needs the ``collector`` extra) takes
  the encodings exporters usually write at ~3.5x less CPU per span and reproduces the reference's
  output exactly; anything else it declines with a reason, and the reference converts it. The result
  says which decoder made it and why the compiled one declined (``ConversionResult.fallback``), so
  callers count fallbacks (the collector shows them in ``/health``).

``raw_proto`` holds the protobuf message types that keep attributes as raw bytes (for caching).
"""

from __future__ import annotations

import functools
from types import ModuleType

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tinkertrace.spanstore.convert import reference
from tinkertrace.spanstore.convert.reference import ConversionResult

__all__ = [
    "ConversionResult",
    "body_to_table",
    "compiled_decoder",
    "request_to_table",
    "warm_up_kernels",
]


def request_to_table(request: ExportTraceServiceRequest, received_at_ns: int) -> ConversionResult:
    """Convert every valid span of ``request``; spans with invalid ids or times are rejected and counted."""
    return body_to_table(request.SerializeToString(), received_at_ns)


def body_to_table(body: bytes, received_at_ns: int) -> ConversionResult:
    """Like :func:`request_to_table` for serialized request bytes; ``DecodeError`` if malformed."""
    compiled = compiled_decoder()
    if compiled is None:
        return reference.convert(body, received_at_ns)
    try:
        return compiled.convert(body, received_at_ns)
    except compiled.Declined as declined:
        result = reference.convert(body, received_at_ns)
        result.fallback = declined.reason
        return result


@functools.cache
def compiled_decoder() -> ModuleType | None:
    """The ``compiled`` module when numba is installed (the ``collector`` extra), else ``None``."""
    try:
        import numba  # noqa: F401
    except ImportError:
        return None
    from tinkertrace.spanstore.convert import compiled

    return compiled


def warm_up_kernels() -> bool:
    """Compile (first run after an install, ~15 s) or load from numba's cache the compiled kernels: the
    span scan and the Parquet page gather. ``False`` when numba is not installed."""
    compiled = compiled_decoder()
    if compiled is None:
        return False
    from tinkertrace.spanstore.list_splice import splice
    from tinkertrace.spanstore.samples import llm_request

    result = compiled.convert(llm_request(2, prompt_tokens=3, response_tokens=2).SerializeToString(), 0)
    if result.accepted != 2:
        raise RuntimeError("the compiled OTLP decoder lost spans of its own sample request")
    splice.warm_up()
    return True
