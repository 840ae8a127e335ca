"""Running an agent over tasks: references to agent and task functions, and the rollout runner.

The agent is any function ``agent(task: dict, **kwargs)`` (sync or async) that returns its reward as a
number (or a dict with a ``"reward"`` key); the examples' agents are written this way. Tasks come from
a function ``load_tasks(split=...)`` that returns dicts with an ``"id"``. Both are named by
``path/to/file.py:function`` or ``package.module:function`` references (:func:`load_ref`).
Evaluation (``tinkertrace.evaluation.evaluate``) and the training workers both run rollouts with this module;
it needs nothing beyond the SDK's core.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.util
import inspect
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# --- references ------------------------------------------------------------------------------------


def load_ref(ref: str) -> Any:
    """The object named by ``path/to/file.py:name`` or ``package.module:name``.

    A file is imported under a name derived from its absolute path, so two examples' ``agent.py``
    files never collide in ``sys.modules``.
    """
    module_part, sep, attr = ref.rpartition(":")
    if not sep or not module_part or not attr:
        raise ValueError(f"reference {ref!r} must look like 'path/to/file.py:function' or 'module:function'")
    if module_part.endswith(".py") or "/" in module_part or module_part.startswith("."):
        module = _import_file(Path(module_part))
    else:
        try:
            module = importlib.import_module(module_part)
        except ImportError as exc:
            raise ValueError(f"reference {ref!r}: cannot import module {module_part!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"reference {ref!r}: module {module_part!r} has no attribute {attr!r}") from None


def _import_file(path: Path) -> Any:
    """Import a file; inside a package (folders with ``__init__.py``) by its dotted name, the
    package's parent folder going on ``sys.path`` as pytest's default import mode does, so the
    file's own package imports (``from examples.common import ...``) work."""
    path = path.resolve()
    if not path.is_file():
        raise ValueError(f"no Python file at {path}")
    root, parts = path.parent, [path.stem]
    while (root / "__init__.py").is_file():
        parts.insert(0, root.name)
        root = root.parent
    if len(parts) > 1:
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
        return importlib.import_module(".".join(parts))
    name = "_tinkertrace_ref_" + hashlib.sha1(str(path).encode()).hexdigest()[:12] + "_" + path.stem
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def load_tasks(
    ref: str | Callable[..., Any], split: str | None = None, limit: int | None = None, **options: Any
) -> list[dict]:
    """Tasks from a task-source function (``split=`` passed when it takes one, ``options`` always),
    each with an ``id``."""
    source = load_ref(ref) if isinstance(ref, str) else ref
    params = inspect.signature(source).parameters
    produced = (
        source(split=split, **options) if split is not None and "split" in params else source(**options)
    )
    tasks = [dict(t) for t in produced]
    for index, task in enumerate(tasks):
        if "id" not in task:
            raise ValueError(f"task #{index} from {ref!r} has no 'id' field: {str(task)[:200]}")
        task["id"] = str(task["id"])
    return tasks[:limit] if limit is not None else tasks


# --- running rollouts --------------------------------------------------------------------------------


@dataclass
class RolloutResult:
    """One agent run on one task."""

    task_id: str
    sample: int
    reward: float | None
    passed: bool
    error: str | None = None
    elapsed_s: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)


def reward_of(value: Any) -> tuple[float | None, dict[str, Any]]:
    """An agent's return value as (reward, extra info): a number, or a dict with ``"reward"``."""
    if isinstance(value, dict):
        extra = {k: v for k, v in value.items() if k != "reward"}
        raw = value.get("reward")
    else:
        extra, raw = {}, value
    if raw is None:
        return None, extra
    try:
        return float(raw), extra
    except (TypeError, ValueError):
        return None, {**extra, "unparsed_return": repr(raw)[:200]}


async def run_rollouts_async(
    agent: Callable[..., Any],
    tasks: Sequence[dict],
    *,
    samples_per_task: int,
    agent_kwargs: dict[str, Any],
    concurrency: int = 8,
    success_threshold: float = 1.0,
    on_result: Callable[[RolloutResult], None] | None = None,
) -> list[RolloutResult]:
    """Run ``agent(task, **agent_kwargs)`` ``samples_per_task`` times per task, at most ``concurrency``
    at once (sync agents run in threads). An agent that raises is recorded with its error."""
    gate = asyncio.Semaphore(max(1, concurrency))
    is_async = inspect.iscoroutinefunction(agent) or inspect.iscoroutinefunction(
        getattr(agent, "__wrapped__", None)
    )

    async def one(task: dict, sample: int) -> RolloutResult:
        async with gate:
            start = time.perf_counter()
            try:
                if is_async:
                    value = await agent(task, **agent_kwargs)
                else:
                    value = await asyncio.to_thread(agent, task, **agent_kwargs)
                    if inspect.isawaitable(value):
                        value = await value
                reward, info = reward_of(value)
                error = None
            except Exception as exc:  # an agent failure is a result, not a crash of the run
                reward, info, error = None, {}, f"{type(exc).__name__}: {exc}"[:500]
            result = RolloutResult(
                task_id=task["id"],
                sample=sample,
                reward=reward,
                passed=reward is not None and reward >= success_threshold,
                error=error,
                elapsed_s=round(time.perf_counter() - start, 4),
                info=info,
            )
            if on_result is not None:
                on_result(result)
            return result

    jobs = [one(task, s) for task in tasks for s in range(samples_per_task)]
    return list(await asyncio.gather(*jobs))


def run_rollouts(agent: Callable[..., Any], tasks: Sequence[dict], **kwargs: Any) -> list[RolloutResult]:
    """Blocking form of :func:`run_rollouts_async`."""
    return asyncio.run(run_rollouts_async(agent, tasks, **kwargs))
