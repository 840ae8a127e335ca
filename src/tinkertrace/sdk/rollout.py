"""``@traced_rollout``: one rollout per call of an agent function, its root span and identity."""

from __future__ import annotations

import collections
import dataclasses
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
from tinkertrace.sdk.context import ROLLOUT, Returned, RolloutState, scoped
from tinkertrace.sdk.rewards import emit_reward
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

    def __enter__(self) -> Returned:
        return self.returned

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

    def __enter__(self) -> Returned:
        return self.returned

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
def traced_rollout(fn: None = None, **options: Any) -> Callable[[F], F]: ...  # the options: below
def traced_rollout(  # type: ignore[misc]  # the second overload's **options are these keywords
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
        return scoped(func, lambda *args, **kwargs: _Rollout.begin(spec, sig, args, kwargs))

    return decorate(fn) if fn is not None else decorate
