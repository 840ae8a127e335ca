"""``@traced_rollout``, ``emit_reward`` and ``agent_span``: the rollout structure of a trace."""

from __future__ import annotations

import collections
import contextvars
import dataclasses
import functools
import hashlib
import inspect
import json
import math
import numbers
import threading
import uuid
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, overload

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from tinkertrace import semconv
from tinkertrace.sdk import runtime
from tinkertrace.sdk.context import AGENT, ROLLOUT, AgentScope, RolloutState
from tinkertrace.sdk.spans import start_span

F = TypeVar("F", bound=Callable[..., Any])
MAX_TASK_INPUT_CHARS = 65_536
MAX_SCALAR_TASK_ID = 128

_attempts: collections.Counter[tuple[str, str]] = collections.Counter()
_attempts_lock = threading.Lock()


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if hasattr(value, "__dict__"):
        return vars(value)
    return str(value)


def task_json(task: Any) -> str:
    """The task as canonical JSON (sorted keys); objects via dataclasses/pydantic/vars, else str."""
    return json.dumps(task, default=_jsonable, sort_keys=True, ensure_ascii=False)


def stable_task_id(task: Any) -> str:
    """A task id that is the same for equal tasks in every process: 16 hex digits of SHA-256."""
    return hashlib.sha256(task_json(task).encode()).hexdigest()[:16]


def _field(task: Any, name: str) -> Any:
    if isinstance(task, Mapping):
        return task.get(name)
    return getattr(task, name, None)


@dataclasses.dataclass(frozen=True)
class _RolloutSpec:
    name: str
    task_arg: str | None
    task_id_arg: str | None
    task_id_field: str | None
    attempt_arg: str
    split_arg: str
    split: str
    record_input: bool


def _identify(
    spec: _RolloutSpec, sig: inspect.Signature, args: tuple, kwargs: dict
) -> tuple[str, int, str, Any]:
    """``(task_id, attempt, split, task)`` of one call from its bound arguments."""
    try:
        bound = sig.bind_partial(*args, **kwargs).arguments
    except TypeError:
        bound = {}
    if spec.task_arg is not None:
        task = bound.get(spec.task_arg)
    elif "task" in bound:
        task = bound["task"]
    else:
        params = [p for p in bound if p not in ("self", "cls")]
        task = bound[params[0]] if params else None
    task_id: Any = bound.get(spec.task_id_arg) if spec.task_id_arg else None
    if task_id is None and spec.task_id_field and task is not None:
        task_id = _field(task, spec.task_id_field)
    if task_id is None and isinstance(task, str | int) and len(str(task)) <= MAX_SCALAR_TASK_ID:
        task_id = task  # a short scalar task names itself
    if task_id is None:
        task_id = stable_task_id(task)
    task_id = str(task_id)
    attempt = bound.get(spec.attempt_arg)
    if not isinstance(attempt, int):
        with _attempts_lock:
            attempt = _attempts[(spec.name, task_id)]
            _attempts[(spec.name, task_id)] += 1
    split = bound.get(spec.split_arg)
    return task_id, int(attempt), str(split) if isinstance(split, str) else spec.split, task


class _Untraced:
    """The scope of a call whose rollout could not be started: the call runs as if undecorated."""

    def returned(self, result: Any) -> Any:
        return result

    def __enter__(self) -> _Untraced:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        return None


class _Rollout:
    """One rollout's span and context, entered around the decorated call."""

    def __init__(self, spec: _RolloutSpec, task_id: str, attempt: int, split: str, task: Any) -> None:
        rt = runtime.get()
        attributes: dict[str, Any] = {
            semconv.ROLLOUT_ID: uuid.uuid4().hex,
            semconv.TASK_ID: task_id,
            semconv.ATTEMPT: attempt,
            semconv.SPLIT: split,
        }
        if spec.record_input:
            try:
                attributes[semconv.TASK_INPUT] = task_json(task)[:MAX_TASK_INPUT_CHARS]
            except (TypeError, ValueError) as exc:
                attributes[semconv.TASK_INPUT] = json.dumps({"unserializable": str(exc)})
        self.span = start_span(rt, f"rollout {spec.name}", semconv.TYPE_ROLLOUT, attributes)
        self.state = RolloutState(str(attributes[semconv.ROLLOUT_ID]), task_id, attempt, split, self.span)

    def enter(self) -> None:
        self._use = trace.use_span(self.span, end_on_exit=False, record_exception=False)
        self._use.__enter__()
        self._token = ROLLOUT.set(self.state)

    @classmethod
    def begin(
        cls, spec: _RolloutSpec, sig: inspect.Signature, args: tuple, kwargs: dict
    ) -> _Rollout | _Untraced:
        """Start a rollout for one call; an untraced scope (with a warning) if tracing itself fails."""
        try:
            rollout = cls(spec, *_identify(spec, sig, args, kwargs))
            rollout.enter()
            return rollout
        except Exception as exc:
            warnings.warn(f"tinkertrace: rollout not traced: {exc}", RuntimeWarning, stacklevel=3)
            return _Untraced()

    def returned(self, result: Any) -> Any:
        """Note the decorated function's result (the final reward if numeric) and pass it on."""
        self._result = result
        return result

    def __enter__(self) -> _Rollout:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.finish(getattr(self, "_result", None), exc)

    def finish(self, result: Any, exc: BaseException | None) -> None:
        try:
            for call in self.state.take_open_calls():
                call.end_with_rollout()
            if exc is None and isinstance(result, numbers.Real) and math.isfinite(result):
                emit_reward(float(result), final=True)
        finally:
            ROLLOUT.reset(self._token)
            self._use.__exit__(None, None, None)
            span = self.span
            if exc is None:
                span.set_attribute(semconv.ROLLOUT_STATUS, semconv.STATUS_SUCCEEDED)
                span.set_status(Status(StatusCode.OK))
            else:
                span.set_attribute(semconv.ROLLOUT_STATUS, semconv.STATUS_FAILED)
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            span.set_attributes(
                {
                    semconv.ROLLOUT_LLM_CALLS: self.state.llm_calls,
                    semconv.ROLLOUT_REWARDS: self.state.rewards,
                    semconv.ROLLOUT_AGENT_SPANS: self.state.agent_spans,
                }
            )
            span.end()


@overload
def traced_rollout(fn: F) -> F: ...
@overload
def traced_rollout(
    fn: None = None,
    *,
    name: str | None = None,
    task_arg: str | None = None,
    task_id_arg: str | None = None,
    task_id_field: str | None = "id",
    attempt_arg: str = "attempt",
    split_arg: str = "split",
    split: str = "train",
    record_input: bool = True,
) -> Callable[[F], F]: ...
def traced_rollout(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    task_arg: str | None = None,
    task_id_arg: str | None = None,
    task_id_field: str | None = "id",
    attempt_arg: str = "attempt",
    split_arg: str = "split",
    split: str = "train",
    record_input: bool = True,
) -> Any:
    """Trace each call of a sync or async agent function as one rollout (bare or with options).

    The task is the argument named ``task_arg`` (default: one named ``task``, else the first).
    Its id is the argument ``task_id_arg`` if given, else the task's ``task_id_field`` (key or
    attribute, default ``id``), else the task itself when a short str or int, else a stable hash
    of it. The attempt is the argument
    ``attempt_arg`` when the function has one, else a per-process count of runs of that task id;
    the split is the argument ``split_arg`` when present, else ``split``. A numeric return value is
    emitted as the final reward. The function's result or exception passes through unchanged.
    """

    def decorate(func: Callable[..., Any]) -> Any:
        spec = _RolloutSpec(
            name or func.__qualname__,
            task_arg,
            task_id_arg,
            task_id_field,
            attempt_arg,
            split_arg,
            split,
            record_input,
        )
        sig = inspect.signature(func)

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with _Rollout.begin(spec, sig, args, kwargs) as rollout:
                    return rollout.returned(await func(*args, **kwargs))

            return async_wrapper

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with _Rollout.begin(spec, sig, args, kwargs) as rollout:
                return rollout.returned(func(*args, **kwargs))

        return wrapper

    return decorate(fn) if fn is not None else decorate


def _number(value: Any, what: str) -> float:
    """A real number (Python or numpy scalar: ``numbers.Real`` includes ``np.float32``, ``np.int64``)
    as a float; ValueError for anything else (strings, None, arrays)."""
    if not isinstance(value, numbers.Real):
        raise ValueError(f"{what} must be a number or a mapping of numbers, got {type(value).__name__}")
    return float(value)


def _reward_dimensions(value: Any, name: str, primary: str | None) -> tuple[str, dict[str, float]]:
    """``(primary name, {name: value})`` from a scalar or a mapping; ValueError if not numeric."""
    if isinstance(value, Mapping):
        if not value:
            raise ValueError("reward mapping is empty")
        dims = {str(k): _number(v, f"reward {k!r}") for k, v in value.items()}
        chosen = primary or (name if name in dims else next(iter(dims)))
        if chosen not in dims:
            raise ValueError(f"primary reward {chosen!r} is not one of {sorted(dims)}")
    else:
        chosen, dims = name, {name: _number(value, "reward")}
    bad = [k for k, v in dims.items() if not math.isfinite(v)]
    if bad:
        raise ValueError(f"reward dimension(s) {bad} are not finite")
    return chosen, dims


def emit_reward(
    value: float | Mapping[str, float],
    name: str = semconv.PRIMARY_REWARD,
    *,
    primary: str | None = None,
    response_id: str | None = None,
    final: bool = False,
) -> bool:
    """Record a reward for the current rollout as a ``gen_ai.evaluation.result`` span.

    ``value`` is a number (dimension ``name``) or a mapping of named dimensions, of which
    ``primary`` (default: ``name`` if present, else the first) is the reward used for training.
    ``response_id`` links it to the ``gen_ai.response.id`` of the LLM call it rewards. Outside a
    rollout, or with a value that is not a finite number, it warns and returns False; it never raises.
    """
    try:
        if ROLLOUT.get() is None:
            warnings.warn(
                "tinkertrace.emit_reward() called outside a @traced_rollout; the reward is not recorded",
                RuntimeWarning,
                stacklevel=2,
            )
            return False
        chosen, dims = _reward_dimensions(value, name, primary)
        attributes: dict[str, Any] = {
            semconv.GENAI_EVALUATION_NAME: chosen,
            semconv.GENAI_EVALUATION_SCORE: dims[chosen],
            semconv.REWARD_NAME: chosen,
            semconv.REWARD_VALUE: dims[chosen],
            semconv.REWARD_DIMENSIONS: json.dumps(dims, sort_keys=True),
            semconv.REWARD_FINAL: final,
        }
        if response_id is not None:
            attributes[semconv.GENAI_RESPONSE_ID] = str(response_id)
        start_span(runtime.get(), semconv.REWARD_SPAN_NAME, semconv.TYPE_REWARD, attributes).end()
        return True
    except Exception as exc:
        warnings.warn(f"tinkertrace: reward not recorded: {exc}", RuntimeWarning, stacklevel=2)
        return False


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
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with self:
                    return await func(*args, **kwargs)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]
