"""Futures like the `tinker` SDK's: `.result()`, `await`, and one ordered worker per client."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from tinker.lib.public_interfaces.api_future import APIFuture, AwaitableConcurrentFuture

T = TypeVar("T")
C = TypeVar("C")


class OrderedWorker:
    """Runs submitted calls one at a time, in submission order, on a single background thread.

    Like Tinker, a client's requests run in the order they were made, so a caller can submit
    `forward_backward` and `optim_step` back to back and await both later.
    """

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> APIFuture[T]:
        """Queue ``fn(*args, **kwargs)``; return a future of its result (or its exception)."""
        return AwaitableConcurrentFuture(self._executor.submit(fn, *args, **kwargs))

    def shutdown(self, wait: bool = True) -> None:
        """Stop accepting work; with ``wait`` finish what is queued first."""
        self._executor.shutdown(wait=wait)


def completed(value: T) -> APIFuture[T]:
    """A future that is already done with ``value``."""
    future: Future[T] = Future()
    future.set_result(value)
    return AwaitableConcurrentFuture(future)


class ClientFuture(APIFuture[C], Generic[C]):
    """A future of a client, as the SDK's client-creation methods return.

    Await it or call `.result()` to get the client. Like the SDK's backward-compatible
    wrappers, attribute access is forwarded to the client, so it can also be used directly.
    """

    def __init__(self, client: C | APIFuture[C]) -> None:
        self._inner: APIFuture[C] = client if isinstance(client, APIFuture) else completed(client)

    def result(self, timeout: float | None = None) -> C:
        return self._inner.result(timeout)

    async def result_async(self, timeout: float | None = None) -> C:
        return await self._inner.result_async(timeout)

    def future(self) -> Future[C]:
        return self._inner.future()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._inner.result(), name)

    def __repr__(self) -> str:
        future = self._inner.future()
        state = repr(future.result()) if future.done() and future.exception() is None else "pending"
        return f"<ClientFuture: {state}>"
