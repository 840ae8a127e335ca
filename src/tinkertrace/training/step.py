"""One training step, shared by batch mode (``training.loop``) and follow mode (``online.follow``).

The pieces, in the order a step uses them:

* :func:`open_training_client` — a LoRA training client for ``config.model``, or one reloaded with
  its optimizer from a checkpoint record (resume); failures become one :class:`BackendError`.
* :func:`prepare_data` — :func:`~tinkertrace.training.dataset.prepare` with the config's grouping,
  advantage mode and constant-group policy.
* :func:`build_batch` — the Datums of some prepared rows (cookbook alignment, ``max_tokens_per_datum``).
* :func:`batch_metrics` — reward, group-outcome and token-count metrics of those rows.
* :func:`train_step` — submit ``forward_backward`` and ``optim_step`` before awaiting either;
  loss metrics plus the sample/train KL.
* :func:`save_checkpoint` — state + sampler weights, appended to ``checkpoints.jsonl``.

Written only against the public ``tinker`` SDK surface, so both backends run it unchanged.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import tinker
from tinker import types

from tinkertrace.training.advantages import group_outcome_fractions
from tinkertrace.training.checkpoints import append_checkpoint
from tinkertrace.training.config import TrainConfig
from tinkertrace.training.dataset import DataReport, TrainingData, prepare
from tinkertrace.training.datums import DatumBatch, build_datums
from tinkertrace.training.errors import BackendError
from tinkertrace.training.metrics import MetricsLogger, kl_sample_train

ADAM_FIELDS = ("beta1", "beta2", "eps", "weight_decay", "grad_clip_norm")


def adam_params(config: TrainConfig) -> types.AdamParams:
    """Tinker's ``AdamParams`` from the config's learning rate and AdamW settings."""
    return types.AdamParams(
        learning_rate=config.learning_rate, **{name: getattr(config, name) for name in ADAM_FIELDS}
    )


def open_training_client(service: Any, config: TrainConfig, resume_from: dict[str, Any] | None = None) -> Any:
    """A new LoRA training client of ``config.model`` (rank ``config.lora_rank``, seeded), or, with
    ``resume_from`` (a checkpoint record), the saved state with its optimizer."""
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


def open_metrics_logger(config: TrainConfig, log_dir: Path, start_step: int) -> MetricsLogger:
    """The ``metrics.jsonl`` (and optional W&B) logger of a run starting at ``start_step``."""
    return MetricsLogger(
        log_dir,
        start_step=start_step,
        wandb_project=config.wandb_project,
        run_name=config.wandb_run_name,
        config=config.to_dict(),
    )


def prepare_data(table: pa.Table, config: TrainConfig, report: DataReport | None = None) -> TrainingData:
    """Trajectory rows → :class:`TrainingData` with the config's group key, advantage mode and
    constant-reward-group policy."""
    return prepare(
        table,
        group_by=config.group_by,
        advantage=config.advantage,
        remove_constant_reward_groups=config.remove_constant_reward_groups,
        report=report,
    )


def build_batch(data: TrainingData, rows: np.ndarray, config: TrainConfig) -> DatumBatch:
    """The Datums of ``rows`` (indices into ``data.table``) for ``config.loss``, each sequence cut to
    ``config.max_tokens_per_datum`` tokens."""
    table = data.table.take(rows)
    return build_datums(
        table["tokens"],
        table["logprobs"],
        table["action_mask"],
        data.advantage_of_row[rows],
        loss_fn=config.loss,
        max_tokens=config.max_tokens_per_datum,
    )


def batch_metrics(data: TrainingData, rows: np.ndarray, batch: DatumBatch) -> dict[str, float]:
    """The data side of a step's metrics (cookbook names): mean reward, episodes, tokens, group
    outcome fractions, and how many rows were truncated or dropped."""
    trajectories = np.unique(data.trajectory_of_row[rows])
    rewards = data.reward_of_trajectory[trajectories]
    fractions = group_outcome_fractions(data.group_of_trajectory[trajectories], rewards)
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
