"""The fallback for clients whose transport is neither a default one nor wrapped: fenced private API.

A client built with a transport of its own (an aiohttp transport, a test's ``MockTransport``, a
proxy library's) sends through no method :mod:`.capture_transport` wraps. For those, this module wraps
the client's private ``Client._send_single_request`` (the one point every request of a client passes),
and there captures only requests whose transport is not traced already (the client's private
``_transport_for_url`` says which transport a URL goes to). Private methods change without notice, so
the fallback is installed only for the versions in :data:`TESTED_VERSIONS`, which a test pins to the
installed ones; for any other version, such clients are not captured and a warning says how to wrap
their transport with :func:`~.capture_transport.traced_transport`.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

from tinkertrace.sdk import capture, capture_transport

log = logging.getLogger("tinkertrace")

TESTED_VERSIONS = {"httpx": ("0.27.", "0.28."), "httpx2": ("2.",)}
"""Version prefixes whose ``_send_single_request`` and ``_transport_for_url`` the fallback was tested
on (tests/sdk/test_capture_fallback.py)."""

_originals: dict[tuple[type, str], Callable[..., Any]] = {}


def supported(lib: ModuleType) -> bool:
    """Whether the fallback may be installed on ``lib`` (a tested version with the methods it uses)."""
    version = importlib.metadata.version(lib.__name__)
    return version.startswith(TESTED_VERSIONS.get(lib.__name__, ())) and all(
        hasattr(cls, name)
        for cls in (lib.Client, lib.AsyncClient)
        for name in ("_send_single_request", "_transport_for_url")
    )


def install(lib: ModuleType) -> bool:
    """Wrap ``lib``'s clients' ``_send_single_request`` (once) when :func:`supported`."""
    if not supported(lib):
        log.warning(
            "tinkertrace: %s %s is not a version the capture fallback was tested on: calls through a "
            "transport of the client's own are not captured (wrap it: transport=traced_transport(...))",
            lib.__name__,
            importlib.metadata.version(lib.__name__),
        )
        return False
    for cls, wrap in ((lib.Client, _wrap_sync), (lib.AsyncClient, _wrap_async)):
        key = (cls, "_send_single_request")
        if key not in _originals:
            _originals[key] = cls._send_single_request
            cls._send_single_request = wrap(lib, _originals[key])
    return True


def uninstall() -> None:
    for (cls, name), original in list(_originals.items()):
        setattr(cls, name, original)
        del _originals[(cls, name)]


def _traced_below(client: Any, request: Any) -> bool:
    """Whether the transport ``client`` sends ``request`` through captures it already."""
    return capture_transport.is_traced(client._transport_for_url(request.url))


def _wrap_sync(lib: ModuleType, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _send_single_request(self: Any, request: Any) -> Any:
        if _traced_below(self, request):
            return original(self, request)
        return capture.send(lib, functools.partial(original, self), request)

    return _send_single_request


def _wrap_async(lib: ModuleType, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def _send_single_request(self: Any, request: Any) -> Any:
        if _traced_below(self, request):
            return await original(self, request)
        return await capture.send_async(lib, functools.partial(original, self), request)

    return _send_single_request
