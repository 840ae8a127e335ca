"""Chaining ``concurrent.futures.Future`` objects: one future settled from another's outcome."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


def settle_from(target: Future[Any], source: Future[Any], fn: Callable[[Any], Any] = lambda r: r) -> None:
    """Once ``source`` is done, settle ``target`` with ``fn(result)``, or with the exception that
    ``source`` (or ``fn``) raised."""

    def done(finished: Future[Any]) -> None:
        try:
            target.set_result(fn(finished.result()))
        except Exception as exc:
            target.set_exception(exc)

    source.add_done_callback(done)


def map_future(source: Future[Any], fn: Callable[[Any], Any]) -> Future[Any]:
    """A future of ``fn(result)`` once ``source`` is done (its exception passes through)."""
    target: Future[Any] = Future()
    settle_from(target, source, fn)
    return target


def failed(exc: BaseException) -> Future[Any]:
    """A future that already failed with ``exc``."""
    future: Future[Any] = Future()
    future.set_exception(exc)
    return future
