"""``agent_span``: names the agent that the LLM calls, rewards and spans inside it belong to."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from tinkertrace import semconv
from tinkertrace.sdk import runtime
from tinkertrace.sdk.context import AGENT, AgentScope, Returned, scoped
from tinkertrace.sdk.spans import start_span

F = TypeVar("F", bound=Callable[..., Any])


@dataclasses.dataclass
class _AgentEntry:
    """What one entry of an :class:`agent_span` undoes on exit."""

    span: trace.Span
    agent_token: contextvars.Token
    use: Any  # the ``trace.use_span`` context manager
    entries_token: contextvars.Token | None = None


class agent_span:  # lower-case: used like a function, ``with agent_span("solver"):``
    """Scope LLM calls to a named agent: ``with agent_span("solver"): ...`` or ``@agent_span("solver")``.

    Starts an ``invoke_agent {name}`` span; every span started inside carries ``gen_ai.agent.name``
    and the agent span's id (``tinkertrace.agent.span_id``). One object may be entered by concurrent
    asyncio tasks and threads, and re-entered: what each entry must undo is kept in the context of
    the task or thread that entered it, never on the shared object.
    """

    def __init__(self, name: str) -> None:
        if not name:
            raise ValueError("agent_span needs a non-empty agent name")
        self.name = name
        # per context: the entries of this object still open there, innermost last; each entry's
        # own token of this variable resets it, so a context keeps nothing once all are exited
        self._entries: contextvars.ContextVar[tuple[_AgentEntry, ...]] = contextvars.ContextVar(
            f"tinkertrace_agent_span_{name}", default=()
        )

    def __enter__(self) -> trace.Span:
        span = start_span(
            runtime.get(),
            f"{semconv.AGENT_OPERATION} {self.name}",
            semconv.TYPE_AGENT,
            {semconv.GENAI_OPERATION: semconv.AGENT_OPERATION, semconv.AGENT_NAME: self.name},
        )
        scope = AgentScope(self.name, format(span.get_span_context().span_id, "016x"))
        entry = _AgentEntry(
            span, AGENT.set(scope), trace.use_span(span, end_on_exit=False, record_exception=False)
        )
        entry.use.__enter__()
        entry.entries_token = self._entries.set((*self._entries.get(), entry))
        return span

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        entries = self._entries.get()
        if not entries:  # e.g. an async generator finalised in another task: never break the agent
            warnings.warn(
                f"tinkertrace: agent_span({self.name!r}) exited in a context that did not enter it; "
                "its span is not ended",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        entry = entries[-1]
        span = entry.span
        self._entries.reset(entry.entries_token)  # type: ignore[arg-type]
        entry.use.__exit__(None, None, None)
        AGENT.reset(entry.agent_token)
        if exc is not None:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        span.end()

    async def __aenter__(self) -> trace.Span:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)

    def __call__(self, func: F) -> F:
        return scoped(func, self._around_call)

    @contextlib.contextmanager
    def _around_call(self, *args: Any, **kwargs: Any) -> Iterator[Returned]:
        with self:
            yield _unchanged


def _unchanged(result: Any) -> Any:
    return result
