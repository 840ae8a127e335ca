"""Automatic capture of OpenAI-compatible LLM calls made through ``httpx`` and ``httpx2``.

``install()`` wraps ``Client._send_single_request`` and ``AsyncClient._send_single_request`` of both
libraries (the one point every request passes, whatever the transport: the OpenAI client 3.x uses
``httpx2``, LiteLLM and others ``httpx``, some with their own transports). Inside a rollout, a POST
to a path ending in ``/chat/completions``, ``/completions`` or ``/responses``:

* gets ``return_token_ids: true`` and ``logprobs`` (chat: ``true``; completions: ``1``; responses:
  ``include: ["message.output_text.logprobs"]``) added when absent (``request_token_ids=False``
  turns this off). The agent then receives those extra response fields too; OpenAI client objects
  keep them as extra attributes. A 400 to the extended request is answered by sending the original
  body again; only if that is taken is that endpoint left unextended (see :mod:`.refusals`).
* becomes a GenAI CLIENT span whose response body is teed: the agent reads every byte (every SSE
  chunk) unchanged, and the span ends when the body is exhausted or closed.

What is recorded of a call is :class:`~tinkertrace.sdk.llm_call.LlmCall`'s; this module is the HTTP
side. It registers itself with the runtime on import (``init()`` installs it when ``capture_http``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.abc
import importlib.util
import logging
import sys
from collections.abc import Callable, Iterator
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

import orjson

from tinkertrace import semconv
from tinkertrace.sdk import runtime
from tinkertrace.sdk.context import AGENT, ROLLOUT
from tinkertrace.sdk.llm_call import LlmCall, call_kind

log = logging.getLogger("tinkertrace")

LIBRARIES = ("httpx", "httpx2")
_originals: dict[tuple[type, str], Callable[..., Any]] = {}


def _set_body(lib: ModuleType, request: Any, content: bytes) -> None:
    request._content = content
    request.stream = lib.ByteStream(content)
    request.headers["Content-Length"] = str(len(content))


def _classify(request: Any) -> str | None:
    if request.method != "POST":
        return None
    kind = call_kind(request.url.path)
    return None if kind == "messages" else kind  # Anthropic calls: recorded at the endpoint / proxy


def _send_identity(request: Any, rollout: Any) -> None:
    """The task, attempt, split and agent beside the rollout id, for a server that records the call
    (values that are not printable ASCII are left out: they cannot travel as header values)."""
    agent = AGENT.get()
    identity = {
        semconv.HEADER_TASK_ID: rollout.task_id,
        semconv.HEADER_ATTEMPT: str(rollout.attempt),
        semconv.HEADER_SPLIT: rollout.split,
        semconv.HEADER_AGENT_NAME: agent.name if agent is not None else None,
    }
    for header, value in identity.items():
        if value and value.isascii() and value.isprintable():
            request.headers[header] = value


def begin(lib: ModuleType, request: Any) -> LlmCall | None:
    """An :class:`LlmCall` for an LLM request inside a rollout, else None. Never raises."""
    rollout = ROLLOUT.get()
    if rollout is None:  # most requests of a process: nothing to classify
        return None
    kind = _classify(request)
    if kind is None:
        return None
    rt = runtime.current()
    if rt is None:
        return None
    try:
        raw = request.content
        body = orjson.loads(raw)
        if not isinstance(body, dict):
            return None
        call = LlmCall(rt, kind, request.url, body, raw, rollout)
        extended = call.extended_body()
        if extended is not None:
            _set_body(lib, request, extended)
        request.headers[semconv.HEADER_ROLLOUT_ID] = rollout.rollout_id
        _send_identity(request, rollout)
        rollout.call_opened(call)
        return call
    except Exception as exc:  # an unreadable request is passed on untraced
        log.debug("tinkertrace: not capturing %s: %s", request.url, exc)
        return None


class _Outcome:
    """Around the iteration of a response body: ends the call as the iteration ends."""

    def __init__(self, call: LlmCall) -> None:
        self.call = call

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            self.call.finish()
        elif isinstance(exc, GeneratorExit):
            self.call.finish(closed_early=True)
        else:
            self.call.fail(exc)


def _tee_types(lib: ModuleType) -> tuple[type, type]:
    class SyncTee(lib.SyncByteStream):  # type: ignore[name-defined]
        def __init__(self, inner: Any, call: LlmCall) -> None:
            self._inner, self._call = inner, call

        def __iter__(self) -> Any:
            feed = self._call.feed
            with _Outcome(self._call):
                for chunk in self._inner:
                    feed(chunk)
                    yield chunk

        def close(self) -> None:
            try:
                self._inner.close()
            finally:
                self._call.finish(closed_early=True)

    class AsyncTee(lib.AsyncByteStream):  # type: ignore[name-defined]
        def __init__(self, inner: Any, call: LlmCall) -> None:
            self._inner, self._call = inner, call

        async def __aiter__(self) -> Any:
            feed = self._call.feed
            with _Outcome(self._call):
                async for chunk in self._inner:
                    feed(chunk)
                    yield chunk

        async def aclose(self) -> None:
            try:
                await self._inner.aclose()
            finally:
                self._call.finish(closed_early=True)

    return SyncTee, AsyncTee


@contextlib.contextmanager
def _failing(call: LlmCall) -> Iterator[None]:
    """Ends the call as failed if sending raises (the exception goes on to the agent)."""
    try:
        yield
    except BaseException as exc:
        call.fail(exc)
        raise


def _wrap_sync(lib: ModuleType, original: Callable[..., Any], tee: type) -> Callable[..., Any]:
    @functools.wraps(original)
    def _send_single_request(self: Any, request: Any) -> Any:
        call = begin(lib, request)
        if call is None:
            return original(self, request)
        with _failing(call):
            response = original(self, request)
            if call.retry_without_injection(response):  # resend the agent's own body
                response.close()
                _set_body(lib, request, call.drop_injection())
                call.judge_refusal((response := original(self, request)).status_code)
        return call.attach(response, tee)

    return _send_single_request


def _wrap_async(lib: ModuleType, original: Callable[..., Any], tee: type) -> Callable[..., Any]:
    @functools.wraps(original)
    async def _send_single_request(self: Any, request: Any) -> Any:
        call = begin(lib, request)
        if call is None:
            return await original(self, request)
        with _failing(call):
            response = await original(self, request)
            if call.retry_without_injection(response):
                await response.aclose()
                _set_body(lib, request, call.drop_injection())
                call.judge_refusal((response := await original(self, request)).status_code)
        return call.attach(response, tee)

    return _send_single_request


def install() -> list[str]:
    """Patch each library of :data:`LIBRARIES` that is already imported, and the others when the agent
    first imports them (an import hook, on the agent's own thread), so tracing imports no HTTP library
    itself (``import httpx`` was most of ``init()``'s time; the OTLP exporter uses ``http.client``).
    Returns the names patched now."""
    patched = [name for name in LIBRARIES if name in sys.modules]
    for name in patched:
        _patch(sys.modules[name])
    _HOOK.names = {name for name in LIBRARIES if name not in sys.modules}
    if _HOOK.names and _HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _HOOK)
    return patched


def _patch(lib: ModuleType) -> None:
    """Wrap ``lib.Client`` and ``lib.AsyncClient``'s ``_send_single_request`` (once)."""
    sync_tee, async_tee = _tee_types(lib)
    for cls, wrap, tee in ((lib.Client, _wrap_sync, sync_tee), (lib.AsyncClient, _wrap_async, async_tee)):
        key = (cls, "_send_single_request")
        if key not in _originals:
            _originals[key] = cls._send_single_request
            cls._send_single_request = wrap(lib, _originals[key], tee)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds a watched library as the other finders do, and patches it once it has been executed."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if fullname not in self.names:
            return None
        self.names.discard(fullname)  # the lookup below then passes over this finder
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    """A library's own loader, which then patches the module it executed."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        _patch(module)

    def __getattr__(self, name: str) -> Any:  # resource readers and the like: the library's loader's
        return getattr(self.loader, name)


_HOOK = _PatchOnImport()


def uninstall() -> None:
    """Restore the original methods and stop watching imports."""
    _HOOK.names = set()
    with contextlib.suppress(ValueError):
        sys.meta_path.remove(_HOOK)
    for (cls, attr), original in list(_originals.items()):
        setattr(cls, attr, original)
        del _originals[(cls, attr)]


runtime.register_instrumentation(
    runtime.Instrumentation(enabled=lambda config: config.capture_http, install=install, uninstall=uninstall)
)
