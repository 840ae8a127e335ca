"""Evaluate an agent over a task split without training: pass@k over rollouts (:mod:`.rollouts`).

The agent is any function ``agent(task: dict, *, base_url: str, model: str, api_key: str, **sampling)``
(sync or async) that returns its reward as a number (or a dict with a ``"reward"`` key).

pass@k is the unbiased estimator of the Codex paper, ``1 - C(n-c, k) / C(n, k)`` per task (n samples,
c of them correct), averaged over tasks (:func:`pass_at_k`).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tinkertrace.evaluation.rollouts import RolloutResult, load_ref, load_tasks, run_rollouts
from tinkertrace.evaluation.settings import EvalSettings
from tinkertrace.models.builtin import BUILTIN_MODEL

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


# --- local sampling endpoint -------------------------------------------------------------------------


@contextmanager
def local_endpoint(model: str = BUILTIN_MODEL, *, base_dir: Path | None = None) -> Iterator[str]:
    """Serve ``model`` with the local engine on a free loopback port; yields the ``/v1`` base URL."""
    from tinkertrace.netutil import BackgroundServer
    from tinkertrace.serving.app import create_app

    policy = _local_policy(model, base_dir)
    try:
        with BackgroundServer(create_app(policy)) as server:
            yield server.url + "/v1"
    finally:
        policy.close()


def _local_policy(model: str, base_dir: Path | None) -> Any:
    from tinkertrace.engine import ServiceClient
    from tinkertrace.serving.policy import policy_from_service

    service = ServiceClient(base_dir=base_dir) if base_dir is not None else ServiceClient()
    return policy_from_service(service, model)


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
    ors = {"openreward": s.openreward} if s.openreward else {}
    task_list = load_tasks(s.tasks, split=s.split, limit=s.max_tasks, **ors)
    if not task_list:
        raise ValueError(f"task source {s.tasks!r} gave no tasks for split {s.split!r}")
    import tinkertrace

    tinkertrace.init(spans_dir=s.spans_dir or s.out.with_name(s.out.stem + ".spans"))
    start = time.perf_counter()
    s.out.parent.mkdir(parents=True, exist_ok=True)
    with s.out.open("w") as sink, _endpoint(s.base_url, s.model) as url:
        import yaml

        extra = {key: yaml.safe_load(value) for key, value in s.agent_kwargs.items()}
        kwargs: dict[str, Any] = {"base_url": url, "model": s.model, "api_key": s.api_key, **ors, **extra}
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
