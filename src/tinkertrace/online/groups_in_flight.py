"""How an agent worker keeps rollout groups in flight, the demo's and those of follow over environments.

:func:`run_groups` runs :data:`GROUPS_IN_FLIGHT` loops side by side; each starts a whole group, waits for
it, and starts the next at once. So a long episode holds up its own group, not the worker: a worker
that ran one group at a time waited for each group's longest rollout before the next started, and
every training mode, the asynchronous ones too, waited for stragglers at the agents.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

GROUPS_IN_FLIGHT = 2
"""Groups an agent worker runs at once (each started whole); the next starts as soon as one is done."""

Group = TypeVar("Group")


def run_groups(next_group: Callable[[], Group | None], run_group: Callable[[Group], None]) -> None:
    """Run ``run_group(next_group())``, :data:`GROUPS_IN_FLIGHT` at a time, until ``next_group``
    returns None (it is called by one loop at a time); returns once the groups in flight are done."""
    picking = threading.Lock()

    def loop() -> None:
        while True:
            with picking:
                group = next_group()
            if group is None:
                return
            run_group(group)

    with ThreadPoolExecutor(GROUPS_IN_FLIGHT, thread_name_prefix="tt-group") as pool:
        for done in [pool.submit(loop) for _ in range(GROUPS_IN_FLIGHT)]:
            done.result()
