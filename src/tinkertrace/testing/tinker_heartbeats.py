"""Which Tinker sessions this process's ``tinker`` SDK still sends heartbeats for.

Every SDK session holder — a ``ServiceClient``'s, and the "shadow" one a
``SamplingClient.from_sampler_handle`` client shares (cached process-wide, with no public close) —
runs a heartbeat task on the SDK's one event loop. ``ServiceClient.close`` cancels its own; a
shadow's ends only when the server answers 410 (session finished) to one of its heartbeats, every
10 s. A shadow left running after its server stopped logs "Session heartbeat failed ... Tinker is
down" two minutes later, so hosted tests wait here for the 410 before they stop the engine.

This reads the SDK's internals (its loop singleton and the ``_session_heartbeat`` coroutine); the
tests of this module fail if a new SDK renames them rather than letting them find nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

from tinker.lib import internal_client_holder as sdk

HEARTBEAT_PERIOD_S = 10.0  # the SDK's SESSION_HEARTBEAT_PERIOD_SEC
HEARTBEAT = "InternalClientHolder._session_heartbeat"


def heartbeating_sessions() -> set[str]:
    """The session ids with a live heartbeat task in this process (empty before the SDK's loop
    started)."""
    loop = sdk._internal_client_holder_thread_singleton.loop_if_started()
    if loop is None:
        return set()

    async def listed() -> set[str]:
        found = set()
        for task in asyncio.all_tasks():
            coro = task.get_coro()
            code = getattr(coro, "cr_code", None)
            if code is not None and code.co_qualname == HEARTBEAT and not task.done():
                found.add(str(coro.cr_frame.f_locals["session_id"]))  # type: ignore[union-attr]
        return found

    return asyncio.run_coroutine_threadsafe(listed(), loop).result(timeout=10)


def wait_heartbeats_stopped(sessions: Iterable[str], timeout: float = HEARTBEAT_PERIOD_S + 5) -> float:
    """Wait until no heartbeat of ``sessions`` is left in this process (finished sessions' shadows
    stop at their next heartbeat, within one period, while the server still answers); the seconds
    it took. TimeoutError naming the sessions still beating after ``timeout`` s."""
    wanted, started = set(sessions), time.monotonic()
    while left := sorted(heartbeating_sessions() & wanted):
        if time.monotonic() - started > timeout:
            raise TimeoutError(
                f"Tinker sessions {left} still send heartbeats {timeout:g} s later: close their "
                "ServiceClient, and finish the session before stopping its server so that its shadow "
                "holders get their 410"
            )
        time.sleep(0.1)
    return time.monotonic() - started
