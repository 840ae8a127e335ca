"""``run_until_stopped``: an environment worker's async group runs to its end, or is cancelled as soon
as ``stop`` is set, its clean-up (``finally``: an ORS episode's session delete) run before it returns."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tinkertrace.online.groups_in_flight import ABANDON_S, run_until_stopped


def test_a_group_that_ends_is_finished() -> None:
    async def group() -> None:
        await asyncio.sleep(0.05)

    assert run_until_stopped(group, threading.Event()) is True


def test_a_group_error_is_raised() -> None:
    async def group() -> None:
        raise ValueError("the group broke")

    with pytest.raises(ValueError, match="the group broke"):
        run_until_stopped(group, threading.Event())


def test_stop_cancels_a_long_group_and_runs_its_clean_up() -> None:
    cleaned: list[float] = []

    async def group() -> None:
        try:
            await asyncio.sleep(600)
        finally:
            await asyncio.sleep(0.2)  # an awaited clean-up (a DELETE request) still runs
            cleaned.append(time.monotonic())

    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    assert run_until_stopped(group, stop) is False
    took = time.monotonic() - started
    assert len(cleaned) == 1 and took < 0.3 + 0.2 + 2.0  # not the group's 600 s


def test_a_clean_up_that_hangs_is_left_after_abandon_s() -> None:
    async def group() -> None:
        try:
            await asyncio.sleep(600)
        finally:
            await asyncio.sleep(600)  # cancelled again once ABANDON_S has passed

    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    assert run_until_stopped(group, stop) is False
    assert 0.2 + ABANDON_S <= time.monotonic() - started < 0.2 + ABANDON_S + 2.0


def test_a_sync_rollout_thread_is_left_behind_not_waited_for() -> None:
    release = threading.Event()

    async def group() -> None:
        await asyncio.to_thread(release.wait, 600)  # a sync agent: cancelling cannot stop its thread

    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    try:
        assert run_until_stopped(group, stop) is False
        assert time.monotonic() - started < 0.2 + 2.0
    finally:
        release.set()
