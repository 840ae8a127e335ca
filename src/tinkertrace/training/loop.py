"""The batch RL loop: trajectories → Datums → forward_backward + optim_step, on either backend.

Written only against the public ``tinker`` SDK surface (``ServiceClient``, ``TrainingClient``
futures, ``tinker.types``), so the same code drives hosted Tinker and the local engine.

Per step: one batch of ``groups_per_batch`` groups (a seeded permutation per epoch), Datums built
as the cookbook aligns them, ``forward_backward`` and ``optim_step`` both submitted before either
is awaited, then metrics from the returned per-datum logprobs. A checkpoint (state + sampler
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
import tinker
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from tinker import types

from tinkertrace.training.advantages import group_outcome_fractions
from tinkertrace.training.backends import make_service_client
from tinkertrace.training.checkpoints import append_checkpoint, read_checkpoints
from tinkertrace.training.config import TrainConfig
from tinkertrace.training.dataset import TrainingData, epoch_batches, load_source, prepare, steps_per_epoch
from tinkertrace.training.datums import DatumBatch, build_datums
from tinkertrace.training.errors import BackendError, ConfigError
from tinkertrace.training.metrics import MetricsLogger, kl_sample_train


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


def _adam(config: TrainConfig) -> types.AdamParams:
    return types.AdamParams(
        learning_rate=config.learning_rate,
        beta1=config.beta1,
        beta2=config.beta2,
        eps=config.eps,
        weight_decay=config.weight_decay,
        grad_clip_norm=config.grad_clip_norm,
    )


def _batch_datums(data: TrainingData, rows: np.ndarray, config: TrainConfig) -> DatumBatch:
    table = data.table.take(rows)
    return build_datums(
        table["tokens"],
        table["logprobs"],
        table["action_mask"],
        data.advantage_of_row[rows],
        loss_fn=config.loss,
        max_tokens=config.max_tokens_per_datum,
    )


def _data_metrics(data: TrainingData, rows: np.ndarray, batch: DatumBatch) -> dict[str, float]:
    trajectories = np.unique(data.trajectory_of_row[rows])
    rewards = data.reward_of_trajectory[trajectories]
    groups = data.group_of_trajectory[trajectories]
    fractions = group_outcome_fractions(groups, rewards)
    action_tokens = batch.num_action_tokens
    return {
        "env/all/reward/total": float(rewards.mean()),
        "env/all/total_episodes": len(trajectories),
        "env/all/total_ac_tokens": action_tokens,
        "env/all/total_ob_tokens": batch.num_tokens - action_tokens,
        **{f"env/all/by_group/{k}": v for k, v in fractions.items()},
        "data/num_datums": len(batch.data),
        "data/num_tokens": batch.num_tokens,
        "data/truncated_rows": batch.truncated_rows,
        "data/dropped_rows": batch.dropped_rows,
    }


def train_step(
    training_client: Any, batch: DatumBatch, config: TrainConfig, adam: types.AdamParams
) -> dict[str, float]:
    """One optimiser step on ``batch``: submit forward_backward and optim_step, then await both."""
    fb_future = training_client.forward_backward(batch.data, config.loss, dict(config.loss_config) or None)
    optim_future = training_client.optim_step(adam)
    fb = fb_future.result()
    optim_future.result()
    training_logprobs = [out["logprobs"].to_numpy() for out in fb.loss_fn_outputs]
    metrics: dict[str, float] = {k: float(v) for k, v in fb.metrics.items()}
    metrics.update(kl_sample_train(batch.sampling_logprobs, training_logprobs, batch.masks))
    return metrics


def save_checkpoint(training_client: Any, log_dir: Path, step: int, record: dict[str, Any]) -> dict[str, Any]:
    """Save state (for resume) and sampler weights under ``step_NNNNNN``; append the record."""
    name = f"step_{step:06d}"
    state_future = training_client.save_state(name)
    sampler_future = training_client.save_weights_for_sampler(name)
    full = {
        "name": name,
        "step": step,
        **record,
        "state_path": state_future.result().path,
        "sampler_path": sampler_future.result().path,
        "time": time.time(),
    }
    append_checkpoint(log_dir, full)
    return full


def _open_training_client(service: Any, config: TrainConfig, resume_from: dict[str, Any] | None) -> Any:
    try:
        if resume_from is not None:
            return service.create_training_client_from_state_with_optimizer(
                resume_from["state_path"]
            ).result()
        return service.create_lora_training_client(
            base_model=config.model, rank=config.lora_rank, seed=config.seed
        ).result()
    except (tinker.TinkerError, ValueError, OSError, LookupError) as exc:
        what = f"checkpoint {resume_from['state_path']}" if resume_from else f"model {config.model!r}"
        raise BackendError(
            f"could not open a training client for {what} on the {config.backend} backend: {exc}"
        ) from None


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
    expected = {
        "data_fingerprint": data.fingerprint,
        "seed": config.seed,
        "groups_per_batch": config.groups_per_batch,
        "shuffle": config.shuffle,
    }
    changed = [k for k, v in expected.items() if last.get(k) != v]
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
    data = prepare(
        table,
        group_by=config.group_by,
        advantage=config.advantage,
        remove_constant_reward_groups=config.remove_constant_reward_groups,
        report=report,
    )
    per_epoch = steps_per_epoch(data.num_groups, config.groups_per_batch)
    total_steps = per_epoch * config.epochs
    resume_from = _resume_point(config, data)
    start_step = int(resume_from["step"]) if resume_from else 0
    (log_dir / "config.json").write_text(json.dumps(config.to_dict(), indent=2))

    service = make_service_client(config.backend, engine_dir=config.engine_dir)
    training_client = _open_training_client(service, config, resume_from)
    adam = _adam(config)
    result = TrainResult(log_dir=log_dir, start_step=start_step, steps=start_step, total_steps=total_steps)
    result.notes.extend(report.notes())
    order_settings = {
        "data_fingerprint": data.fingerprint,
        "seed": config.seed,
        "groups_per_batch": config.groups_per_batch,
        "shuffle": config.shuffle,
    }
    rollout_ids = data.table["rollout_id"].to_numpy(zero_copy_only=False)
    trained_since_save: set[str] = set()
    truncated = dropped = 0
    started = time.monotonic()
    bar = _progress(progress, console)
    logger = MetricsLogger(
        log_dir,
        start_step=start_step,
        wandb_project=config.wandb_project,
        run_name=config.wandb_run_name,
        config=config.to_dict(),
    )
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
            batch = _batch_datums(data, rows, config)
            truncated, dropped = truncated + batch.truncated_rows, dropped + batch.dropped_rows
            metrics: dict[str, Any] = {
                "progress/batch": step,
                "progress/epoch": epoch,
                "progress/done_frac": (step + 1) / total_steps,
                "optim/lr": config.learning_rate,
                **_data_metrics(data, rows, batch),
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
