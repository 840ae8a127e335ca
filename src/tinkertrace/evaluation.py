"""Evaluate an agent over a task split without training: pass@k and the rollout runner.

The agent is any function ``agent(task: dict, *, base_url: str, model: str, api_key: str, **sampling)``
(sync or async) that returns its reward as a number (or a dict with a ``"reward"`` key); the
examples' agents are written this way. Tasks come from a function ``load_tasks(split=...)`` that
returns dicts with an ``"id"``. Both are named by ``path/to/file.py:function`` or
``package.module:function`` references (:func:`load_ref`).

pass@k is the unbiased estimator of the Codex paper, ``1 - C(n-c, k) / C(n, k)`` per task (n samples,
c of them correct), averaged over tasks (:func:`pass_at_k`).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.util
import inspect
import json
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tinkertrace.builtin import BUILTIN_MODEL
from tinkertrace.evaluation_settings import EvalSettings

# --- pass@k ------------------------------------------------------------------------------------------


def pass_at_k(n: Sequence[int] | np.ndarray, c: Sequence[int] | np.ndarray, k: int) -> np.ndarray:
    """Per-task unbiased pass@k, ``1 - C(n-c, k) / C(n, k)``, for arrays of sample counts ``n`` and
    correct counts ``c``.

    Computed as ``1 - prod_{i<k} (n-c-i)/(n-i)`` over a (tasks × k) array, so it stays exact in
    floating point for large ``n`` where the binomials would overflow. Raises ``ValueError`` when a
    task has fewer than ``k`` samples, or ``c`` outside ``[0, n]``.
    """
    n_arr = np.asarray(n, dtype=np.int64)
    c_arr = np.asarray(c, dtype=np.int64)
    if n_arr.shape != c_arr.shape:
        raise ValueError(f"n and c differ in shape: {n_arr.shape} vs {c_arr.shape}")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if np.any((c_arr < 0) | (c_arr > n_arr)):
        raise ValueError("every c must lie in [0, n]")
    if np.any(n_arr < k):
        short = int(n_arr.min())
        raise ValueError(f"pass@{k} needs at least {k} samples per task; a task has only {short}")
    i = np.arange(k, dtype=np.float64)[None, :]
    numer = (n_arr - c_arr)[:, None] - i
    denom = n_arr[:, None] - i
    ratio = np.clip(numer, 0.0, None) / denom
    return 1.0 - np.prod(ratio, axis=1)


def pass_at_k_summary(n: np.ndarray, c: np.ndarray, ks: Sequence[int]) -> dict[str, float]:
    """Mean pass@k over tasks for each k that every task has enough samples for."""
    return {f"pass@{k}": float(pass_at_k(n, c, k).mean()) for k in ks if len(n) and int(np.min(n)) >= k}


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
    ref: str | Callable[..., Any], split: str | None = None, limit: int | None = None
) -> list[dict]:
    """Tasks from a task-source function (``split=`` passed when it takes one), each with an ``id``."""
    source = load_ref(ref) if isinstance(ref, str) else ref
    params = inspect.signature(source).parameters
    produced = source(split=split) if split is not None and "split" in params else source()
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


# --- local sampling endpoint -------------------------------------------------------------------------


@contextmanager
def local_endpoint(model: str = BUILTIN_MODEL, *, base_dir: Path | None = None) -> Iterator[str]:
    """Serve ``model`` with the local engine on a free loopback port; yields the ``/v1`` base URL."""
    from tinkertrace.netutil import BackgroundServer
    from tinkertrace.serving.app import create_app

    policy = _local_policy(model, base_dir)
    with BackgroundServer(create_app(policy)) as server:
        yield server.url + "/v1"


def _local_policy(model: str, base_dir: Path | None) -> Any:
    from tinkertrace.engine import ServiceClient
    from tinkertrace.serving.policy import PolicyHolder
    from tinkertrace.tokenizer import load_tokenizer

    service = ServiceClient(base_dir=base_dir) if base_dir is not None else ServiceClient()
    sampler = service.create_sampling_client(base_model=model)
    return PolicyHolder(sampler, load_tokenizer(model), model)


# --- the eval runner ---------------------------------------------------------------------------------


@dataclass
class EvalSummary:
    """What ``tinkertrace eval`` reports."""

    tasks: int
    rollouts: int
    failed_rollouts: int
    mean_reward: float
    pass_at_k: dict[str, float]
    results_path: str
    elapsed_s: float


def summarize(results: Sequence[RolloutResult], ks: Sequence[int]) -> tuple[dict[str, float], int]:
    """pass@k over tasks and the number of tasks, from per-rollout results."""
    if not results:
        return {}, 0
    ids = np.array([r.task_id for r in results])
    passed = np.array([r.passed for r in results], dtype=np.int64)
    _, inverse = np.unique(ids, return_inverse=True)
    n = np.bincount(inverse)
    c = np.bincount(inverse, weights=passed).astype(np.int64)
    return pass_at_k_summary(n, c, ks), len(n)


def evaluate(settings: EvalSettings, on_result: Callable[[RolloutResult], None] | None = None) -> EvalSummary:
    """Run the agent on every task of the split ``samples_per_task`` times; write one JSON line per
    rollout to ``settings.out`` and the summary (pass@k for each k) next to it (:func:`summary_path`).

    Without ``base_url`` a local sampling endpoint is started on ``model`` (the built-in model by
    default). The rollouts are traced into ``spans_dir`` (default: ``<out stem>.spans/`` next to ``out``).
    ConfigError for bad settings; ValueError when the task source gives no tasks.
    """
    s = settings.validate()
    agent_fn = load_ref(s.agent)
    task_list = load_tasks(s.tasks, split=s.split, limit=s.max_tasks)
    if not task_list:
        raise ValueError(f"task source {s.tasks!r} gave no tasks for split {s.split!r}")
    import tinkertrace

    tinkertrace.init(spans_dir=s.spans_dir or s.out.with_name(s.out.stem + ".spans"))
    start = time.perf_counter()
    s.out.parent.mkdir(parents=True, exist_ok=True)
    with s.out.open("w") as sink, _endpoint(s.base_url, s.model) as url:
        kwargs: dict[str, Any] = {"base_url": url, "model": s.model, "api_key": s.api_key}
        if s.temperature is not None:
            kwargs["temperature"] = s.temperature

        def write(result: RolloutResult) -> None:
            sink.write(json.dumps(asdict(result), default=str) + "\n")
            sink.flush()
            if on_result is not None:
                on_result(result)

        results = run_rollouts(
            agent_fn,
            task_list,
            samples_per_task=s.samples_per_task,
            agent_kwargs=kwargs,
            concurrency=s.concurrency,
            success_threshold=s.success_threshold,
            on_result=write,
        )
    tinkertrace.flush()
    scores, n_tasks = summarize(results, s.ks)
    rewards = [r.reward for r in results if r.reward is not None]
    summary = EvalSummary(
        tasks=n_tasks,
        rollouts=len(results),
        failed_rollouts=sum(r.error is not None for r in results),
        mean_reward=float(np.mean(rewards)) if rewards else math.nan,
        pass_at_k=scores,
        results_path=str(s.out),
        elapsed_s=round(time.perf_counter() - start, 3),
    )
    summary_path(s.out).write_text(json.dumps(asdict(summary), indent=2) + "\n")
    return summary


def summary_path(out: Path) -> Path:
    """Where :func:`evaluate` writes the summary for results file ``out``."""
    return out.with_name(out.stem + ".summary.json")


@contextmanager
def _endpoint(base_url: str | None, model: str) -> Iterator[str]:
    if base_url is not None:
        yield base_url
        return
    with local_endpoint(model) as url:
        yield url
