"""How an agent worker keeps rollout groups in flight, the demo's and those of follow over environments.

:func:`run_groups` runs :data:`GROUPS_IN_FLIGHT` loops side by side; each starts a whole group, waits for
it, and starts the next at once. So a long episode holds up its own group, not the worker: a worker
that ran one group at a time waited for each group's longest rollout before the next started, and
every training mode, the asynchronous ones too, waited for stragglers at the agents.

When ``stop`` is set, a group in flight is not finished: :func:`run_until_stopped` cancels it (an
async rollout's ``finally`` runs, so an ORS episode deletes its session; a sync rollout's thread is
left behind), and the worker ends within about :data:`ABANDON_S`.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, TypeVar

GROUPS_IN_FLIGHT = 2
"""Groups an agent worker runs at once (each started whole); the next starts as soon as one is done."""

WAKE_S = 0.5
"""How often the waiting thread wakes: Python runs a signal handler (the workers' SIGTERM, which sets
``stop``) only when the main thread runs, and the kernel may hand the signal to a group's thread."""

ABANDON_S = 3.0
"""How long a cancelled group's clean-up (its rollouts' ``finally`` blocks: closing ORS sessions) may take
before the group is left behind."""

STOP_POLL_S = 0.1
"""How often a running async group looks at ``stop``."""

Group = TypeVar("Group")


def run_groups(
    next_group: Callable[[], Group],
    run_group: Callable[[Group], None],
    stop: threading.Event,
    parent_pid: int | None = None,
) -> None:
    """Run ``run_group(next_group())``, :data:`GROUPS_IN_FLIGHT` at a time (``next_group`` is called by
    one loop at a time), until ``stop`` is set or the process ``parent_pid`` is no longer this one's
    parent; returns once the groups in flight are done."""
    picking = threading.Lock()

    def loop() -> None:
        while True:
            with picking:
                if stop.is_set() or (parent_pid is not None and os.getppid() != parent_pid):
                    return
                group = next_group()
            run_group(group)

    with ThreadPoolExecutor(GROUPS_IN_FLIGHT, thread_name_prefix="tt-group") as pool:
        loops = [pool.submit(loop) for _ in range(GROUPS_IN_FLIGHT)]
        while wait(loops, timeout=WAKE_S).not_done:
            pass
        for done in loops:
            done.result()  # a loop's error, raised here


def run_until_stopped(make: Callable[[], Coroutine[Any, Any, Any]], stop: threading.Event) -> bool:
    """Run the coroutine ``make()`` on an event loop of its own (in this thread) until it is done or
    ``stop`` is set, then cancel it and give its clean-up :data:`ABANDON_S`; whether it finished.

    Not ``asyncio.run``, which waits for the loop's threads: a sync agent's rollout runs in one
    (``asyncio.to_thread``), and cancelling cannot stop it. It is left running, for the worker's exit."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(_until_stopped(make(), stop))
    finally:
        left = asyncio.all_tasks(loop)  # a clean-up past ABANDON_S: cancelled again
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.wait(left))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()  # its thread pool is shut down without waiting


async def _until_stopped(coro: Coroutine[Any, Any, Any], stop: threading.Event) -> bool:
    task = asyncio.ensure_future(coro)
    while not stop.is_set():
        done, _ = await asyncio.wait({task}, timeout=STOP_POLL_S)
        if done:
            task.result()  # its error, raised here
            return True
    task.cancel()
    await asyncio.wait({task}, timeout=ABANDON_S)
    return False
