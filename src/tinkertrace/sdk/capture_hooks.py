"""Installing the LLM-call capture: on the libraries already imported, and on import for the others.

``init()`` calls :func:`install` (when ``capture_http``): each of ``httpx`` and ``httpx2`` gets its
default transports traced (:mod:`.capture_transport`) and, on tested versions, the fallback for
clients with a transport of their own (:mod:`.capture_fallback`). A library the agent imports later is
patched as its import completes, on the agent's own thread, so tracing imports no HTTP library itself.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

from tinkertrace.sdk import capture_fallback, capture_transport, runtime
from tinkertrace.sdk.capture import LIBRARIES


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
    """Trace ``lib``'s default transports, and other transports through the fallback where tested."""
    capture_transport.wrap_default_transports(lib)
    capture_fallback.install(lib)


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
    capture_transport.unwrap_default_transports()
    capture_fallback.uninstall()


runtime.register_instrumentation(
    runtime.Instrumentation(enabled=lambda config: config.capture_http, install=install, uninstall=uninstall)
)
