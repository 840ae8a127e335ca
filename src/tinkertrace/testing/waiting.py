"""Waiting on a state with a deadline: what tests do instead of sleeping and hoping."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def wait_until(check: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll ``check`` until it is true; raise ``TimeoutError`` naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not met within {timeout} s")
        time.sleep(0.01)


async def wait_until_async(check: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """``wait_until`` for code on an event loop: yields to the loop between polls."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not met within {timeout} s")
        await asyncio.sleep(0.005)
