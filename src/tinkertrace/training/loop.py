"""The batch RL loop: trajectories → Datums → forward_backward + optim_step, on either backend.

Written only against the public ``tinker`` SDK surface (``ServiceClient``, ``TrainingClient``
futures, ``tinker.types``), so the same code drives hosted Tinker and the local engine.

Per step: one batch of ``groups_per_batch`` groups (a seeded permutation per epoch), then the
shared step of :mod:`tinkertrace.training.step` (Datums built as the cookbook aligns them,
``forward_backward`` and ``optim_step`` both submitted before either is awaited, metrics from the
returned per-datum logprobs). A checkpoint (state + sampler
weights) is saved every ``save_every`` steps and at the end and recorded in ``checkpoints.jsonl``;
``resume`` reloads the last one with its optimizer state and continues at the same data position.
"""

from __future__ import annotations

import json
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tinkertrace.training.backends import make_service_client
from tinkertrace.training.checkpoints import read_checkpoints
from tinkertrace.training.config import TrainConfig
from tinkertrace.training.dataset import TrainingData, epoch_batches, load_source, steps_per_epoch
from tinkertrace.training.errors import ConfigError
from tinkertrace.training.step import (
    adam_params,
    batch_metrics,
    build_batch,
    open_metrics_logger,
    open_training_client,
    prepare_data,
    save_checkpoint,
    train_step,
)


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


def _order_settings(config: TrainConfig, data: TrainingData) -> dict[str, Any]:
    """What fixes the data order; recorded with each checkpoint and checked on resume."""
    return {
        "data_fingerprint": data.fingerprint,
        "seed": config.seed,
        "groups_per_batch": config.groups_per_batch,
        "shuffle": config.shuffle,
    }


def _resume_point(config: TrainConfig, data: TrainingData) -> dict[str, Any] | None:
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


def _progress(enabled: bool, console: Console | None) -> Progress | None:
    if not enabled:
        return None
    return Progress(
        TextColumn("[bold]train[/] epoch {task.fields[epoch]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("reward {task.fields[reward]}  loss {task.fields[loss]}  kl {task.fields[kl]}"),
        TimeElapsedColumn(),
        console=console,
    )


def run_training(
    config: TrainConfig, *, progress: bool = True, console: Console | None = None
) -> TrainResult:
    """Train on ``config.source`` for ``config.epochs`` epochs; see the module docstring."""
    config.validate()
    if config.source is None:
        raise ConfigError("no training source given (a trajectories file/folder or a spans folder)")
    if config.backend == "tinker" and config.lora_rank < 1:
        raise ConfigError("hosted Tinker trains LoRA adapters only: lora_rank must be at least 1")
    log_dir = Path(config.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)

    table, report = load_source(Path(config.source), log_dir / "build")
    data = prepare_data(table, config, report)
    per_epoch = steps_per_epoch(data.num_groups, config.groups_per_batch)
    total_steps = per_epoch * config.epochs
    resume_from = _resume_point(config, data)
    start_step = int(resume_from["step"]) if resume_from else 0
    (log_dir / "config.json").write_text(json.dumps(config.to_dict(), indent=2))

    service = make_service_client(config.backend, engine_dir=config.engine_dir)
    training_client = open_training_client(service, config, resume_from)
    adam = adam_params(config)
    result = TrainResult(log_dir=log_dir, start_step=start_step, steps=start_step, total_steps=total_steps)
    result.notes.extend(report.notes())
    order_settings = _order_settings(config, data)
    rollout_ids = data.table["rollout_id"].to_numpy(zero_copy_only=False)
    trained_since_save: set[str] = set()
    truncated = dropped = 0
    started = time.monotonic()
    bar = _progress(progress, console)
    logger = open_metrics_logger(config, log_dir, start_step)
    result.notes.extend(logger.notes)
    with logger, bar if bar is not None else nullcontext():
        task = (
            bar.add_task(
                "train", total=total_steps, completed=start_step, epoch=1, reward="-", loss="-", kl="-"
            )
            if bar is not None
            else None
        )
        batches: dict[int, list[np.ndarray]] = {}
        for step in range(start_step, total_steps):
            step_started = time.monotonic()
            epoch, index = divmod(step, per_epoch)
            if epoch not in batches:
                batches = {
                    epoch: epoch_batches(
                        data.num_groups,
                        config.groups_per_batch,
                        seed=config.seed,
                        epoch=epoch,
                        shuffle=config.shuffle,
                    )
                }
            rows = data.rows_for_groups(batches[epoch][index])
            batch = build_batch(data, rows, config)
            truncated, dropped = truncated + batch.truncated_rows, dropped + batch.dropped_rows
            metrics: dict[str, Any] = {
                "progress/batch": step,
                "progress/epoch": epoch,
                "progress/done_frac": (step + 1) / total_steps,
                "optim/lr": config.learning_rate,
                **batch_metrics(data, rows, batch),
            }
            if batch.data:
                metrics.update(train_step(training_client, batch, config, adam))
                trained_since_save.update(rollout_ids[rows[batch.row_index]].tolist())
            done = step + 1
            if (config.save_every and done % config.save_every == 0) or done == total_steps:
                record = {"epoch": epoch, "trained_rollout_ids": sorted(trained_since_save), **order_settings}
                result.checkpoints.append(save_checkpoint(training_client, log_dir, done, record))
                trained_since_save.clear()
            metrics["time/step"] = time.monotonic() - step_started
            metrics["time/total"] = time.monotonic() - started
            logger.log(step, metrics)
            result.steps, result.last_metrics = done, metrics
            if bar is not None and task is not None:
                bar.update(
                    task,
                    completed=done,
                    epoch=epoch + 1,
                    reward=f"{metrics['env/all/reward/total']:.3f}",
                    loss=f"{metrics.get('loss:sum', float('nan')):.3f}",
                    kl=f"{metrics.get('optim/kl_sample_train_v1', float('nan')):.4f}",
                )
    if truncated:
        result.notes.append(
            f"{truncated} sequences were longer than max_tokens_per_datum={config.max_tokens_per_datum} "
            "and kept only their first tokens"
        )
    if dropped:
        result.notes.append(
            f"{dropped} sequences had no sampled token to train on (within the limit) and were skipped"
        )
    return result
