"""The rollout and agent in effect, held in context variables, and how they reach threads.

asyncio tasks copy the context when created, so they see the rollout with no help. Threads do
not: :func:`in_context` wraps a callable to run in a copy of the caller's context, and ``init()``
patches ``ThreadPoolExecutor.submit`` (and so ``loop.run_in_executor``) to do that for every task
submitted inside a rollout.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, ParamSpec, TypeVar

from opentelemetry.trace import Span

P = ParamSpec("P")
R = TypeVar("R")


@dataclass
class RolloutState:
    """One running rollout: its identity and the counts the root span reports at the end."""

    rollout_id: str
    task_id: str
    attempt: int
    split: str
    span: Span
    llm_calls: int = 0
    rewards: int = 0
    agent_spans: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _open_calls: set[Any] = field(default_factory=set, repr=False)  # LLM calls not ended yet

    def count(self, attribute: str) -> None:
        with self._lock:
            setattr(self, attribute, getattr(self, attribute) + 1)

    def call_opened(self, call: Any) -> None:
        with self._lock:
            self._open_calls.add(call)

    def call_ended(self, call: Any) -> None:
        with self._lock:
            self._open_calls.discard(call)

    def take_open_calls(self) -> list[Any]:
        """The LLM calls still open (a stream the agent left unclosed or keeps open), now forgotten."""
        with self._lock:
            calls, self._open_calls = list(self._open_calls), set()
        return calls


ROLLOUT: contextvars.ContextVar[RolloutState | None] = contextvars.ContextVar(
    "tinkertrace_rollout", default=None
)


@dataclass(frozen=True)
class AgentScope:
    """The agent span in effect: its name and span id (16 hex digits)."""

    name: str
    span_id: str


AGENT: contextvars.ContextVar[AgentScope | None] = contextvars.ContextVar("tinkertrace_agent", default=None)


def current_rollout() -> RolloutState | None:
    """The rollout in effect here, or None."""
    return ROLLOUT.get()


def in_context(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` bound to a copy of the current context: hand it to a thread to keep the rollout."""
    ctx = contextvars.copy_context()

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        return ctx.run(fn, *args, **kwargs)

    return run


Returned = Callable[[Any], Any]  # what a scope does with the function's result (passes it on)


def scoped(func: Callable[..., Any], enter: Callable[..., AbstractContextManager[Returned]]) -> Any:
    """``func`` (sync or async) run inside ``enter(*args, **kwargs)``, a context manager whose value
    sees the result on its way out: ``@traced_rollout`` and ``@agent_span(...)`` wrap functions so."""
    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            with enter(*args, **kwargs) as returned:
                return returned(await func(*args, **kwargs))

        return async_wrapper

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with enter(*args, **kwargs) as returned:
            return returned(func(*args, **kwargs))

    return wrapper


_original_submit = ThreadPoolExecutor.submit


def _submit_in_context(
    self: ThreadPoolExecutor, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
) -> Future:
    if ROLLOUT.get() is None:
        return _original_submit(self, fn, *args, **kwargs)
    return _original_submit(self, contextvars.copy_context().run, fn, *args, **kwargs)


def patch_executors() -> None:
    """Make ``ThreadPoolExecutor.submit`` carry the submitter's context inside a rollout."""
    ThreadPoolExecutor.submit = _submit_in_context  # type: ignore[method-assign, assignment]


def unpatch_executors() -> None:
    ThreadPoolExecutor.submit = _original_submit  # type: ignore[method-assign]
