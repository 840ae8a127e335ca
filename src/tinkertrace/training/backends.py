"""The two training backends behind one client API: hosted Tinker and the local engine.

Both return an object with ``tinker.ServiceClient``'s methods, so the training loop is the same
code for either. Problems the user can fix (no API key, service unreachable) raise
:class:`BackendError` with one clear message.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Literal

from tinkertrace.training.errors import BackendError

Backend = Literal["auto", "local", "tinker"]
BACKENDS: tuple[str, ...] = ("auto", "local", "tinker")
HEALTH_PATH = "/api/v1/healthz"


def resolve_backend(backend: Backend) -> tuple[Backend, str]:
    """The backend a run uses and why: ``auto`` is hosted Tinker when ``$TINKER_API_KEY`` is set,
    else the local engine (as the OpenReward trainer's config file does)."""
    if backend != "auto":
        return backend, f"backend {backend} (asked for)"
    if os.environ.get("TINKER_API_KEY"):
        return "tinker", "backend tinker (auto: TINKER_API_KEY is set)"
    return "local", "backend local engine (auto: no TINKER_API_KEY)"


def tinker_base_url() -> str:
    """The Tinker API URL the SDK will use ($TINKER_BASE_URL, else the SDK's production default)."""
    try:
        from tinker.lib.base_url import resolve_base_url

        return resolve_base_url()
    except ImportError:  # an SDK without the helper: same rule by hand
        url = os.environ.get("TINKER_BASE_URL") or "https://tinker.thinkingmachines.dev/services/tinker-prod"
        return url.rstrip("/")


def check_tinker_reachable(base_url: str, timeout_s: float = 10.0) -> None:
    """Raise BackendError unless something answers HTTP at ``base_url`` (any status counts)."""
    import httpx

    try:
        httpx.get(base_url + HEALTH_PATH, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise BackendError(
            f"cannot reach the Tinker service at {base_url} ({type(exc).__name__}: {exc}). "
            "Check the network, or $TINKER_BASE_URL (e.g. the URL of a running `tinkertrace engine`); "
            "use --backend local to train on this machine."
        ) from None


def make_service_client(
    backend: str, *, engine_dir: Path | None = None, check_reachable: bool = True, timeout_s: float = 10.0
) -> Any:
    """A ``ServiceClient`` for ``backend``.

    ``"tinker"``: the real ``tinker.ServiceClient()``, with ``TINKER_API_KEY`` and ``TINKER_BASE_URL``
    from the environment (hosted Tinker, or ``tinkertrace engine`` on this machine); the service is
    probed first so an unreachable one fails fast with a clear message.
    ``"local"``: ``tinkertrace.engine.ServiceClient(base_dir=engine_dir)`` (default folder
    ``$TINKERTRACE_HOME/engine``).
    """
    backend = resolve_backend(backend)[0]  # type: ignore[arg-type]  # an unknown name falls through below
    if backend == "local":
        from tinkertrace.engine import ServiceClient

        return ServiceClient(base_dir=engine_dir)
    if backend == "tinker":
        if not os.environ.get("TINKER_API_KEY"):
            raise BackendError(
                "the tinker backend needs an API key: export TINKER_API_KEY=<your key> "
                "(from the Tinker console; any tml-... key for a local `tinkertrace engine`), "
                "or use --backend local to train on this machine"
            )
        if check_reachable:
            check_tinker_reachable(tinker_base_url(), timeout_s)
        import tinker

        try:
            return tinker.ServiceClient()
        except tinker.TinkerError as exc:
            raise BackendError(f"could not start a Tinker session: {exc}") from None
    raise BackendError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")


def close_service(service: Any, status: str = "success") -> None:
    """End ``service``'s session and stop its threads: hosted Tinker's heartbeats (a session left open
    heartbeats until the process ends), the local engine's decoding threads. A failure to reach the
    service while closing is logged, not raised: the run's own outcome is what the caller reports."""
    try:
        service.close(status).result(timeout=30)
    except Exception as exc:  # the SDK's network errors, a timeout
        logging.getLogger(__name__).warning("closing the %s session failed: %s", type(service).__name__, exc)
