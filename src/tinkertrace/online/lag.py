"""Follow mode's lag (seconds from a rollout's end to the end of the step that trained it, in parts)
and its progress line."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console
from rich.progress import SpinnerColumn, TextColumn, TimeElapsedColumn

from tinkertrace.training.progress import StepProgress
from tinkertrace.training.step import status_line

LAG_PARTS = ("arrive", "queue", "train")  # rollout end → built → its step starts → its step ends


def percentiles(values: list[float] | np.ndarray) -> tuple[float, float]:
    """p50 and p95 of ``values`` (NaN, NaN when empty)."""
    if len(values) == 0:
        return float("nan"), float("nan")
    p50, p95 = np.percentile(np.asarray(values, dtype=np.float64), [50, 95])
    return float(p50), float(p95)


def rollout_lags(
    table: pa.Table, kept: set[str], arrived: dict[str, float], step_started: float
) -> tuple[list[float], dict[str, list[float]]]:
    """Seconds from each kept rollout's end to now, and that lag's parts (:data:`LAG_PARTS`): until
    it was built from the spans (``arrived``: rollout id → when), then until its step started, then
    the step."""
    per = table.group_by("rollout_id").aggregate([("end_time", "max")])
    per = per.filter(pc.is_in(per["rollout_id"], pa.array(sorted(kept), pa.string())))
    per = per.filter(pc.is_valid(per["end_time_max"]))
    ends = pc.cast(per["end_time_max"], pa.int64()).to_numpy(zero_copy_only=False) / 1e9
    came = np.array([arrived[r] for r in per["rollout_id"].to_pylist()], dtype=np.float64)
    now = time.time()
    parts = {"arrive": came - ends, "queue": step_started - came, "train": now - step_started}
    return (now - ends).tolist(), {k: np.broadcast_to(v, ends.shape).tolist() for k, v in parts.items()}


def step_lags(
    table: pa.Table,
    kept: set[str],
    arrived: dict[str, float],
    step_started: float,
    lags_s: list[float],
    parts_s: dict[str, list[float]],
) -> dict[str, float]:
    """This step's lags (:func:`rollout_lags`) appended to the run's ``lags_s`` and ``parts_s``; the
    step's lag metrics (p50 and p95 of the whole lag, p95 of each part)."""
    lags, parts = rollout_lags(table, kept, arrived, step_started)
    lags_s.extend(lags)
    metrics: dict[str, float] = {}
    for name, values in parts.items():
        parts_s[name].extend(values)
        metrics[f"lag/{name}_p95_s"] = percentiles(values)[1]
    p50, p95 = percentiles(lags)
    return {**metrics, "lag/rollout_to_trained_p50_s": p50, "lag/rollout_to_trained_p95_s": p95}


def follow_progress(
    console: Console | None, enabled: bool, total: int | None, completed: int
) -> StepProgress:
    """The ``train --follow`` progress line."""
    columns = [
        SpinnerColumn(),
        TextColumn("[bold]train --follow[/] step {task.completed}"),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
    ]
    status = "waiting for rollouts"
    return StepProgress(enabled, console, columns, total=total, completed=completed, status=status)


def follow_status(metrics: dict[str, Any]) -> str:
    """A step's reward, loss and lag, for the progress line."""
    return f"{status_line(metrics)}  lag p50 {metrics['lag/rollout_to_trained_p50_s']:.1f}s"
