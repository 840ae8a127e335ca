"""The capture in httpx's own layering: a transport takes a request and returns a response.

Two ways in, both public API of ``httpx`` and ``httpx2``:

* :func:`wrap_default_transports` wraps ``HTTPTransport.handle_request`` and
  ``AsyncHTTPTransport.handle_async_request``, the transports every client uses unless given another
  (the OpenAI and Anthropic clients, plain ``httpx.Client()``, LiteLLM's sync path);
* :func:`traced_transport` wraps any transport a client brings:
  ``httpx.Client(transport=traced_transport(MyTransport()))`` or, for the OpenAI client,
  ``openai.OpenAI(http_client=httpx2.Client(transport=traced_transport(httpx2.HTTPTransport())))``.

A request is captured once: the outermost layer marks it (``extensions["tinkertrace.captured"]``) and
inner ones pass it on.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from tinkertrace.sdk import capture

_originals: dict[tuple[type, str], Callable[..., Any]] = {}


def _traced_sync(lib: ModuleType, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def handle_request(self: Any, request: Any) -> Any:
        return capture.send(lib, functools.partial(original, self), request)

    handle_request.__tinkertrace_traced__ = True  # type: ignore[attr-defined]
    return handle_request


def _traced_async(lib: ModuleType, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def handle_async_request(self: Any, request: Any) -> Any:
        return await capture.send_async(lib, functools.partial(original, self), request)

    handle_async_request.__tinkertrace_traced__ = True  # type: ignore[attr-defined]
    return handle_async_request


def wrap_default_transports(lib: ModuleType) -> None:
    """Trace every request of ``lib``'s ``HTTPTransport`` and ``AsyncHTTPTransport`` (once)."""
    for cls, method, wrap in (
        (lib.HTTPTransport, "handle_request", _traced_sync),
        (lib.AsyncHTTPTransport, "handle_async_request", _traced_async),
    ):
        if (cls, method) not in _originals:
            _originals[(cls, method)] = getattr(cls, method)
            setattr(cls, method, wrap(lib, _originals[(cls, method)]))


def unwrap_default_transports() -> None:
    """Restore the default transports' own methods."""
    for (cls, method), original in list(_originals.items()):
        setattr(cls, method, original)
        del _originals[(cls, method)]


def is_traced(transport: Any) -> bool:
    """Whether requests sent through ``transport`` are captured by this module."""
    method = getattr(type(transport), "handle_request", None) or getattr(
        type(transport), "handle_async_request", None
    )
    traced_default = getattr(method, "__tinkertrace_traced__", False)
    return traced_default or isinstance(transport, (_TracedSync, _TracedAsync))


class _TracedSync:
    """A transport that captures the LLM calls sent through the transport it wraps."""

    def __init__(self, lib: ModuleType, inner: Any) -> None:
        self._lib, self.inner = lib, inner

    def handle_request(self, request: Any) -> Any:
        return capture.send(self._lib, self.inner.handle_request, request)

    def close(self) -> None:
        self.inner.close()

    def __enter__(self) -> _TracedSync:
        self.inner.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.inner.__exit__(*exc)


class _TracedAsync:
    """The async form of :class:`_TracedSync`."""

    def __init__(self, lib: ModuleType, inner: Any) -> None:
        self._lib, self.inner = lib, inner

    async def handle_async_request(self, request: Any) -> Any:
        return await capture.send_async(self._lib, self.inner.handle_async_request, request)

    async def aclose(self) -> None:
        await self.inner.aclose()

    async def __aenter__(self) -> _TracedAsync:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.inner.__aexit__(*exc)


@functools.cache
def _transport_type(lib: ModuleType, sync: bool, asynchronous: bool) -> type:
    """``lib``'s tracing transport for the interfaces its inner transport has (``MockTransport`` has
    both), a subclass of the library's public transport base classes."""
    parts = [(_TracedSync, lib.BaseTransport)] * sync + [
        (_TracedAsync, lib.AsyncBaseTransport)
    ] * asynchronous
    bases = tuple(mixin for mixin, _ in parts) + tuple(base for _, base in parts)
    return type("TracedTransport", bases, {})


def traced_transport(inner: Any) -> Any:
    """``inner`` (an ``httpx`` or ``httpx2`` transport, sync or async) with its LLM calls captured:
    pass the result as a client's ``transport=``. Its library is the one ``inner`` belongs to."""
    for name in capture.LIBRARIES:
        lib = sys.modules.get(name)
        if lib is None:
            continue
        sync, asynchronous = isinstance(inner, lib.BaseTransport), isinstance(inner, lib.AsyncBaseTransport)
        if sync or asynchronous:
            return _transport_type(lib, sync, asynchronous)(lib, inner)
    raise TypeError(f"not an httpx or httpx2 transport: {type(inner).__name__}")
