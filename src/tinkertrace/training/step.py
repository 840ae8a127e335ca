"""One training step, shared by batch mode (``training.loop``) and follow mode (``online.follow``).

:class:`TrainingSession` is the step orchestration both loops run: opened once per run (config.json,
training client, metrics log), then per step :meth:`~TrainingSession.step` (Datums → forward_backward
+ optim_step → metrics), :meth:`~TrainingSession.checkpoint` when the loop says so, and
:meth:`~TrainingSession.log`. The loops only choose the rows of each step and what a checkpoint
records. The pieces it is made of, in the order a step uses them:

* :func:`open_training_client` — a LoRA training client for ``config.model``, or one reloaded with
  its optimizer from a checkpoint record (resume); failures become one :class:`BackendError`.
* :func:`prepare_data` — :func:`~tinkertrace.training.dataset.prepare` with the config's grouping,
  advantage mode and constant-group policy.
* :func:`build_batch` — the Datums of some prepared rows (cookbook alignment, ``max_tokens_per_datum``).
* :func:`batch_metrics` — reward, group-outcome and token-count metrics of those rows.
* :func:`train_step` — ``num_substeps`` minibatches, each ``forward_backward`` + ``optim_step``, all
  submitted before any is awaited; loss metrics plus the sample/train KL.
* :func:`save_checkpoint` — state + sampler weights, appended to ``checkpoints.jsonl``.

Written only against the public ``tinker`` SDK surface, so both backends run it unchanged.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import tinker
from tinker import types

from tinkertrace.training.advantages import group_outcome_fractions
from tinkertrace.training.backends import close_service, make_service_client
from tinkertrace.training.checkpoints import append_checkpoint
from tinkertrace.training.config import TrainSettings
from tinkertrace.training.dataset import DataReport, TrainingData, prepare
from tinkertrace.training.datums import DatumBatch, build_datums
from tinkertrace.training.environments import environment_metrics, group_environments
from tinkertrace.training.errors import BackendError
from tinkertrace.training.metrics import MetricsLogger, kl_sample_train
from tinkertrace.training.offpolicy import (
    DEFAULT_CLIP_HIGH,
    DEFAULT_CLIP_LOW,
    clipped_fraction,
    mismatch_metrics,
)
from tinkertrace.training.outcomes import TRAINED, OutcomeLog, dropped_where, outcome_rows
from tinkertrace.training.trainability import replies_of

ADAM_FIELDS = ("beta1", "beta2", "eps", "weight_decay", "grad_clip_norm")
CLIPPED_LOSSES = ("ppo", "cispo")
# (training client, batch, target token ages or None) → metrics
BatchHook = Callable[[Any, DatumBatch, list[np.ndarray] | None], dict[str, float]]
AgeHook = Callable[[pa.Table, DatumBatch], list[np.ndarray]]  # (step's rows, batch) → target token ages


def adam_params(config: TrainSettings) -> types.AdamParams:
    """Tinker's ``AdamParams`` from the config's learning rate and AdamW settings."""
    return types.AdamParams(
        learning_rate=config.learning_rate, **{name: getattr(config, name) for name in ADAM_FIELDS}
    )


def open_training_client(
    service: Any, config: TrainSettings, resume_from: dict[str, Any] | None = None
) -> Any:
    """A new LoRA training client of ``config.model`` (rank ``config.lora_rank``, seeded), or, with
    ``resume_from`` (a checkpoint record; else ``config.resume_from``, a state path), the saved state
    with its optimizer."""
    if resume_from is None and config.resume_from:
        resume_from = {"state_path": config.resume_from}
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


def open_metrics_logger(config: TrainSettings, log_dir: Path, start_step: int) -> MetricsLogger:
    """The ``metrics.jsonl`` (and optional W&B) logger of a run starting at ``start_step``."""
    return MetricsLogger(
        log_dir,
        start_step=start_step,
        wandb_project=config.wandb_project,
        run_name=config.wandb_run_name,
        config=config.to_dict(),
    )


def prepare_data(table: pa.Table, config: TrainSettings, report: DataReport | None = None) -> TrainingData:
    """Trajectory rows → :class:`TrainingData` with the config's group key, advantage mode and
    constant-reward-group policy."""
    return prepare(
        table,
        group_by=config.group_by,
        advantage=config.advantage,
        remove_constant_reward_groups=config.remove_constant_reward_groups,
        report=report,
    )


def build_batch(data: TrainingData, rows: np.ndarray, config: TrainSettings) -> DatumBatch:
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


def step_outcomes(rows: pa.Table, batch: DatumBatch, step: int) -> list[dict[str, Any]]:
    """Outcome records of a step's rows: trained (with the tokens its Datum kept) or dropped for
    want of a sampled token."""
    usable = np.zeros(rows.num_rows, dtype=bool)
    usable[batch.row_index] = True
    kept = [d.model_input.length + 1 for d in batch.data]
    trained = outcome_rows(rows.take(batch.row_index), TRAINED, step=step, tokens=kept)
    return trained + dropped_where(rows, ~usable, "no_trainable_tokens", step=step)


def cut_share_metrics(table: pa.Table, env_names: list[str]) -> dict[str, float]:
    """``env/all/replies/cut_share``: the share of the replies of a step's rows (``table``) that the
    reply cap cut, and ``env/NAME/replies/cut_share`` per environment; none where no row says."""
    replies, cut = (c.to_numpy(zero_copy_only=False) for c in replies_of(table))
    out = {}
    if replies.sum():
        out["env/all/replies/cut_share"] = float(cut.sum() / replies.sum())
    if env_names:
        index = group_environments(table["task_id"], env_names)
        for i, name in enumerate(env_names):
            mine = index == i
            if replies[mine].sum():
                out[f"env/{name}/replies/cut_share"] = float(cut[mine].sum() / replies[mine].sum())
    return out


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


def minibatches(count: int, num_substeps: int) -> list[slice]:
    """The ``num_substeps`` contiguous minibatches of ``count`` Datums (fewer when there are fewer
    Datums; sizes differ by at most one), as the cookbook splits a batch."""
    parts = min(num_substeps, count)
    bounds = [i * count // parts for i in range(parts + 1)] if parts else [0]
    return [slice(a, b) for a, b in itertools.pairwise(bounds)]


def merged_loss_metrics(per_substep: list[dict[str, float]]) -> dict[str, float]:
    """One step's loss metrics from its minibatches': Tinker's ``name:sum`` summed, ``:max`` / ``:min``
    their extreme, the rest (``:mean`` and unsuffixed) averaged."""
    reducers: dict[str, Callable[[list[float]], float]] = {"sum": sum, "max": max, "min": min}
    keys = dict.fromkeys(k for metrics in per_substep for k in metrics)
    merged = {}
    for key in keys:
        values = [float(m[key]) for m in per_substep if key in m]
        reduce = reducers.get(key.rpartition(":")[2], lambda v: sum(v) / len(v))
        merged[key] = reduce(values)
    return merged


def train_step(
    training_client: Any,
    batch: DatumBatch,
    config: TrainSettings,
    adam: types.AdamParams,
    ages: list[np.ndarray] | None = None,
) -> dict[str, float]:
    """``config.num_substeps`` optimiser steps on ``batch``'s minibatches: every forward_backward and
    optim_step submitted in order before any is awaited (one request pipeline). ``ages`` (each target
    token's age in versions, aligned with ``batch.masks``) adds the mismatch KL by age.

    The trainer's logprobs are each minibatch's own forward pass: with several substeps, minibatch
    ``k``'s are taken after the step's first ``k - 1`` updates. So the clipped share covers them all
    (the clip acts from the second on), and the sample/train KL too (as the cookbook's), but the
    ``offpolicy/mismatch…`` figures, which measure the sampler against the policy the step starts
    from, come from the first minibatch alone."""
    loss_config = dict(config.loss_config) or None
    parts = minibatches(len(batch.data), config.num_substeps)
    futures = [
        (
            training_client.forward_backward(batch.data[part], config.loss, loss_config),
            training_client.optim_step(adam),
        )
        for part in parts
    ]
    results = []
    for fb_future, optim_future in futures:
        results.append(fb_future.result())
        optim_future.result()
    training_logprobs = [out["logprobs"].to_numpy() for fb in results for out in fb.loss_fn_outputs]
    metrics = merged_loss_metrics([fb.metrics for fb in results])
    if config.num_substeps > 1:
        metrics["optim/substeps"] = len(parts)
    metrics.update(kl_sample_train(batch.sampling_logprobs, training_logprobs, batch.masks))
    first = parts[0]
    metrics.update(
        mismatch_metrics(
            batch.sampling_logprobs[first],
            training_logprobs[first],
            batch.masks[first],
            None,
            ages[first] if ages is not None else None,
        )
    )
    if config.loss in CLIPPED_LOSSES and batch.masks:
        low = float(config.loss_config.get("clip_low_threshold", DEFAULT_CLIP_LOW))
        high = float(config.loss_config.get("clip_high_threshold", DEFAULT_CLIP_HIGH))
        reference = [d.loss_fn_inputs["logprobs"].to_numpy() for d in batch.data]
        metrics["offpolicy/clipped_frac"] = clipped_fraction(
            training_logprobs, reference, batch.masks, low, high
        )
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


class TrainingSession:
    """The training side of one run, the same for batch and follow mode.

    Opening it writes ``config.json`` (the config, plus ``extra_config``), opens the training client
    (``resume_from``: a checkpoint record to continue from) and the metrics log starting at
    ``start_step``; use it as a context manager so the log is closed.
    """

    def __init__(
        self,
        config: TrainSettings,
        *,
        start_step: int = 0,
        resume_from: dict[str, Any] | None = None,
        service: Any = None,
        extra_config: dict[str, Any] | None = None,
    ) -> None:
        self.config = config
        self.log_dir = Path(config.log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        (self.log_dir / "config.json").write_text(
            json.dumps({**config.to_dict(), **(extra_config or {})}, indent=2)
        )
        self._own_service = (
            None if service else make_service_client(config.backend, engine_dir=config.engine_dir)
        )
        service = service or self._own_service
        self.client = open_training_client(service, config, resume_from)
        self.adam = adam_params(config)
        self.logger = open_metrics_logger(config, self.log_dir, start_step)
        self.outcomes = OutcomeLog(self.log_dir, start_step)
        self.pending: list[dict[str, Any]] = []  # outcome records written with the next step's metrics
        self.started = time.monotonic()

    @property
    def notes(self) -> list[str]:
        """What the metrics log wants the user to know (e.g. W&B not available)."""
        return self.logger.notes

    def step(
        self,
        data: TrainingData,
        rows: np.ndarray,
        step: int,
        progress: dict[str, Any],
        before_train: BatchHook | None = None,
        token_ages: AgeHook | None = None,
    ) -> tuple[DatumBatch, dict[str, Any]]:
        """Train on ``rows`` of ``data`` as step ``step``: the batch and its metrics (``progress``
        first, then the data side, then the loss and KL when the batch had anything to train).
        ``before_train`` may rewrite the batch's Datums first (follow mode's staleness correction);
        the metrics it returns are logged beside the step's. ``token_ages`` gives each trained token's
        age in versions (follow mode): the mismatch KL is then also reported by age."""
        batch = build_batch(data, rows, self.config)
        taken = data.table.take(rows)
        self.pending += step_outcomes(taken, batch, step)
        metrics: dict[str, Any] = {
            "progress/batch": step,
            **progress,
            "optim/lr": self.config.learning_rate,
            **batch_metrics(data, rows, batch),
        }
        if self.config.environments:
            trajectories, first = np.unique(data.trajectory_of_row[rows], return_index=True)
            names = [env.name for env in self.config.environments]
            task_ids = data.table["task_id"].take(rows[first])
            metrics.update(environment_metrics(task_ids, data.reward_of_trajectory[trajectories], names))
        metrics.update(cut_share_metrics(taken, [env.name for env in self.config.environments]))
        if batch.data:
            ages = token_ages(taken, batch) if token_ages is not None else None
            corrected = before_train(self.client, batch, ages) if before_train is not None else {}
            metrics.update(train_step(self.client, batch, self.config, self.adam, ages))
            # the correction's own mismatch figures: its forward pass sees the weights the step starts
            # from, where train_step's later minibatches see the step's first updates
            metrics.update(corrected)
        return batch, metrics

    def checkpoint(self, step: int, record: dict[str, Any]) -> dict[str, Any]:
        """Save state and sampler weights as after ``step`` steps; the full checkpoint record."""
        return save_checkpoint(self.client, self.log_dir, step, record)

    def log(self, step: int, metrics: dict[str, Any], step_started: float) -> None:
        """Add the step's and the run's time to ``metrics`` and write them."""
        now = time.monotonic()
        metrics["time/step"] = now - step_started
        metrics["time/total"] = now - self.started
        self.logger.log(step, metrics)
        self.outcomes.write(self.pending)
        self.pending = []

    def __enter__(self) -> TrainingSession:
        self.logger.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.logger.close()
        if self._own_service is not None:  # a service this session made: end it (its heartbeats, threads)
            close_service(self._own_service, "success" if exc[0] is None else "errored")


def status_line(metrics: dict[str, Any]) -> str:
    """Reward and loss of a step, for a progress display."""
    return f"reward {metrics['env/all/reward/total']:.3f}  loss {metrics.get('loss:sum', float('nan')):.3f}"
