"""The batch RL loop: trajectories → Datums → forward_backward + optim_step, on either backend.

Written only against the public ``tinker`` SDK surface (``ServiceClient``, ``TrainingClient``
futures, ``tinker.types``), so the same code drives hosted Tinker and the local engine.

Per step: one batch of ``groups_per_batch`` groups (a seeded permutation per epoch), then the
shared step of :class:`tinkertrace.training.step.TrainingSession` (Datums built as the cookbook
aligns them, ``forward_backward`` and ``optim_step`` both submitted before either is awaited,
metrics from the returned per-datum logprobs). A checkpoint (state + sampler weights) is saved every
``save_every`` steps and at the end and recorded in ``checkpoints.jsonl``; ``resume`` reloads the
last one with its optimizer state and continues at the same data position.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

from tinkertrace.settings import ConfigError
from tinkertrace.training.checkpoints import read_checkpoints
from tinkertrace.training.config import TrainSettings
from tinkertrace.training.dataset import (
    DataReport,
    TrainingData,
    epoch_batches,
    is_spans_folder,
    load_source,
    steps_per_epoch,
)
from tinkertrace.training.environments import epoch_order, group_environments, load_environments
from tinkertrace.training.progress import StepProgress
from tinkertrace.training.step import TrainingSession, prepare_data, status_line


@dataclass
class TrainResult:
    """What a run did: steps, where its checkpoints are, the last metrics and any data notes."""

    log_dir: Path
    start_step: int
    steps: int
    total_steps: int
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    last_metrics: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def final_checkpoint(self) -> dict[str, Any] | None:
        """The last checkpoint record of the run, if any was saved."""
        return self.checkpoints[-1] if self.checkpoints else None


def _order_settings(config: TrainSettings, data: TrainingData) -> dict[str, Any]:
    """What fixes the data order; recorded with each checkpoint and checked on resume."""
    order = {
        "data_fingerprint": data.fingerprint,
        "seed": config.seed,
        "groups_per_batch": config.groups_per_batch,
        "shuffle": config.shuffle,
    }
    if config.environments:
        order["environment_weights"] = {env.name: env.weight for env in config.environments}
    return order


def _resume_point(config: TrainSettings, data: TrainingData) -> dict[str, Any] | None:
    records = read_checkpoints(config.log_dir)
    if not records:
        return None
    if not config.resume:
        raise ConfigError(
            f"{config.log_dir} already holds checkpoints from an earlier run: pass --resume to continue it, "
            "or choose another --log-dir"
        )
    last = records[-1]
    changed = [k for k, v in _order_settings(config, data).items() if last.get(k) != v]
    if changed:
        raise ConfigError(
            f"cannot resume from {last['name']} in {config.log_dir}: {', '.join(changed)} changed since"
            " it was saved (the data order would differ); keep them, or use another --log-dir"
        )
    return last


class _Plan:
    """Which rows each step trains: ``groups_per_batch`` groups, in a seeded order per epoch."""

    def __init__(self, data: TrainingData, config: TrainSettings) -> None:
        self.data, self.config = data, config
        self.per_epoch = steps_per_epoch(data.num_groups, config.groups_per_batch)
        self.total = self.per_epoch * config.epochs
        self._epoch = -1  # the epoch whose batches are in self._batches
        self._batches: list[np.ndarray] = []
        names = [env.name for env in config.environments]
        first_rows = np.unique(data.group_of_row, return_index=True)[1]
        self.group_env = group_environments(data.table["task_id"].take(first_rows), names) if names else None

    def rows(self, step: int) -> tuple[int, np.ndarray]:
        """The epoch of ``step`` and the rows (indices into ``data.table``) it trains."""
        epoch, index = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            c = self.config
            if self.group_env is None:
                self._batches = epoch_batches(
                    self.data.num_groups, c.groups_per_batch, seed=c.seed, epoch=epoch, shuffle=c.shuffle
                )
            else:  # each environment's weight share of every batch, while it has groups left
                weights = [env.weight for env in c.environments]
                order = epoch_order(self.group_env, weights, seed=c.seed, epoch=epoch, shuffle=c.shuffle)
                self._batches = [
                    order[i : i + c.groups_per_batch] for i in range(0, len(order), c.groups_per_batch)
                ]
            self._epoch = epoch
        return epoch, self.data.rows_for_groups(self._batches[index])

    def checkpoint_due(self, done: int) -> bool:
        """Whether a checkpoint is saved after ``done`` steps."""
        every = self.config.save_every
        return bool(every and done % every == 0) or done == self.total


def _load(config: TrainSettings) -> tuple[TrainingData, list[str]]:
    """The prepared training data of ``config.source``, and notes on what was left out."""
    config.validate()
    if config.source is None:
        raise ConfigError("no training source given (a trajectories file/folder or a spans folder)")
    if config.backend == "tinker" and config.lora_rank < 1:
        raise ConfigError("hosted Tinker trains LoRA adapters only: lora_rank must be at least 1")
    log_dir = Path(config.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    if not config.environments:
        table, report = load_source(Path(config.source), log_dir / "build")
        return prepare_data(table, config, report), report.notes()
    source = Path(config.source)
    if is_spans_folder(source):
        report = DataReport(source=f"{source} (spans, built per environment)")
        table, stats, notes = load_environments(source, config.environments, None)
    else:
        built, report = load_source(source, log_dir / "build")
        table, stats, notes = load_environments(source, config.environments, built)
    report.rows_read = table.num_rows
    (log_dir / "environments.json").write_text(json.dumps(stats, indent=2))
    return prepare_data(table, config, report), notes + report.notes()


def _progress(enabled: bool, console: Console | None, plan: _Plan, start: int) -> StepProgress:
    columns = [
        TextColumn("[bold]train[/] epoch {task.fields[epoch]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
    ]
    return StepProgress(enabled, console, columns, total=plan.total, completed=start, epoch=1, status="")


def run_training(
    config: TrainSettings, *, progress: bool = True, console: Console | None = None
) -> TrainResult:
    """Train on ``config.source`` for ``config.epochs`` epochs; see the module docstring."""
    data, notes = _load(config)
    plan = _Plan(data, config)
    resume_from = _resume_point(config, data)
    start = int(resume_from["step"]) if resume_from else 0
    result = TrainResult(
        log_dir=Path(config.log_dir), start_step=start, steps=start, total_steps=plan.total, notes=notes
    )
    session = TrainingSession(config, start_step=start, resume_from=resume_from)
    session.outcomes.write(data.report.dropped)  # left out while preparing, before any step
    result.notes.extend(session.notes)
    run = _BatchRun(session, plan, result)
    with session, _progress(progress, console, plan, start) as bar:
        for step in range(start, plan.total):
            epoch, metrics = run.step(step)
            kl = metrics.get("optim/kl_sample_train_v1", float("nan"))
            bar.update(completed=step + 1, epoch=epoch + 1, status=f"{status_line(metrics)}  kl {kl:.4f}")
    result.notes.extend(run.notes())
    return result


class _BatchRun:
    """A batch run's steps: each trains its planned rows and saves a checkpoint when one is due,
    recording the rollouts trained since the last one."""

    def __init__(self, session: TrainingSession, plan: _Plan, result: TrainResult) -> None:
        self.session, self.plan, self.result = session, plan, result
        self.order = _order_settings(plan.config, plan.data)
        self.rollout_ids = plan.data.table["rollout_id"].to_numpy(zero_copy_only=False)
        self.trained_since_save: set[str] = set()
        self.truncated = self.dropped = 0

    def step(self, step: int) -> tuple[int, dict[str, Any]]:
        """Run ``step``; its epoch and metrics."""
        started = time.monotonic()
        epoch, rows = self.plan.rows(step)
        done_frac = (step + 1) / self.plan.total
        batch, metrics = self.session.step(
            self.plan.data, rows, step, {"progress/epoch": epoch, "progress/done_frac": done_frac}
        )
        self.truncated += batch.truncated_rows
        self.dropped += batch.dropped_rows
        if batch.data:
            self.trained_since_save.update(self.rollout_ids[rows[batch.row_index]].tolist())
        done = step + 1
        # the metrics line goes first: a crash before the checkpoint repeats the step on resume, which
        # rewrites its line; the other order could lose the line of a checkpointed step for good
        self.session.log(step, metrics, started)
        if self.plan.checkpoint_due(done):
            trained = sorted(self.trained_since_save)
            record = {"epoch": epoch, "trained_rollout_ids": trained, **self.order}
            self.result.checkpoints.append(self.session.checkpoint(done, record))
            self.trained_since_save.clear()
        self.result.steps, self.result.last_metrics = done, metrics
        return epoch, metrics

    def notes(self) -> list[str]:
        """What the run left out of the sequences it was given."""
        notes = []
        if self.truncated:
            notes.append(
                f"{self.truncated} sequences were longer than max_tokens_per_datum="
                f"{self.plan.config.max_tokens_per_datum} and kept only their first tokens"
            )
        if self.dropped:
            notes.append(
                f"{self.dropped} sequences had no sampled token to train on (within the limit) "
                "and were skipped"
            )
        return notes
