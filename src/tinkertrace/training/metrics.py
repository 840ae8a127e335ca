"""Per-step training metrics: the cookbook's names, a ``metrics.jsonl`` writer, optional W&B.

Names follow tinker-cookbook where one exists: ``env/all/reward/total``,
``env/all/by_group/frac_{mixed,all_good,all_bad}``, ``optim/lr``, ``optim/kl_sample_train_v1``,
``optim/kl_sample_train_v2``, ``optim/entropy``, ``progress/batch``, ``progress/done_frac``,
``time/total``. Each line of ``metrics.jsonl`` is ``{"step": n, <name>: value, ...}``.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from tinkertrace.training.jsonl import append_jsonl, read_jsonl

METRICS_FILE = "metrics.jsonl"


def kl_sample_train(
    sampling_logprobs: list[np.ndarray], training_logprobs: list[np.ndarray], masks: list[np.ndarray]
) -> dict[str, float]:
    """KL estimates between the sampling policy and the training forward pass, over sampled tokens.

    ``v1 = mean(lp_sample - lp_train)``, ``v2 = 0.5 * mean((lp_sample - lp_train)**2)``,
    ``entropy = -mean(lp_sample)`` (the cookbook's ``compute_kl_sample_train``).
    """
    if not masks:
        return {}
    mask = np.concatenate(masks) > 0
    if not mask.any():
        return {}
    sampled = np.concatenate(sampling_logprobs).astype(np.float64)[mask]
    trained = np.concatenate(training_logprobs).astype(np.float64)[mask]
    diff = sampled - trained
    return {
        "optim/kl_sample_train_v1": float(diff.mean()),
        "optim/kl_sample_train_v2": float(0.5 * (diff**2).mean()),
        "optim/entropy": float(-sampled.mean()),
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_metrics(log_dir: Path) -> list[dict[str, Any]]:
    """All records of ``<log_dir>/metrics.jsonl`` (empty when the file does not exist)."""
    return read_jsonl(Path(log_dir) / METRICS_FILE)


class MetricsLogger:
    """Appends one JSON line per step to ``<log_dir>/metrics.jsonl`` and mirrors it to W&B if configured.

    W&B is used when ``wandb_project`` (or ``$WANDB_PROJECT``) is set and the ``wandb`` package is
    installed; it is imported only then. ``start_step`` drops records of steps at or after it (a
    resumed run rewrites the steps it repeats, so the file matches an uninterrupted run).
    """

    def __init__(
        self,
        log_dir: Path,
        *,
        start_step: int = 0,
        wandb_project: str | None = None,
        run_name: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.path = Path(log_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = [r for r in read_metrics(self.path.parent) if int(r.get("step", -1)) < start_step]
        self.path.write_text("")
        append_jsonl(self.path, kept)
        self._file = self.path.open("a")
        self.notes: list[str] = []
        self._wandb: Any = None
        project = wandb_project or os.environ.get("WANDB_PROJECT")
        if project:
            if importlib.util.find_spec("wandb") is None:
                self.notes.append(
                    f"W&B project {project!r} configured but the wandb package is not installed"
                )
            else:
                wandb = importlib.import_module("wandb")
                self._wandb = wandb.init(
                    project=project, name=run_name, config=dict(config or {}), resume="allow"
                )

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Write one step's metrics (non-finite floats become null)."""
        record = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._wandb is not None:
            self._wandb.log(dict(metrics), step=step)

    def close(self) -> None:
        """Close the file and finish the W&B run."""
        self._file.close()
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
