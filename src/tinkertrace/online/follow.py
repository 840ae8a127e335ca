"""Tail-follow training: train on rollouts as their spans arrive, publish each new policy version.

Each poll builds only new complete rollouts (:class:`~tinkertrace.online.tail.SpanTail`, polled on
its own thread so building overlaps training) into a buffer. A group (the GRPO group key) is ready
once it holds ``group_size`` rollouts, or at least two after waiting ``group_timeout_s``. When
``groups_per_batch`` groups are ready (or the oldest ready one waited ``group_timeout_s``) one step
runs: advantages and Datums as in batch mode (the shared step of ``training.step``), then a
checkpoint whose record lists the rollouts trained (and dropped), then the new weights are published
as policy version = steps.

Staleness: a rollout sampled by policy version ``v`` is ``step - v`` versions old at training time;
beyond ``max_staleness`` it is dropped (``staleness_mode="drop"``) or its advantage is scaled by
``staleness_decay ** (age - max_staleness)`` (``"downweight"``). Dropped counts are logged.
Staleness is bounded at the source too: the trainer states its demand (rollouts per step, max
staleness) to the endpoint it publishes to, whose admission gate starts only as many new rollouts
as the trainer will consume in time (:mod:`tinkertrace.serving.admission`).

Exactly-once: every step is checkpointed with its rollout ids; a restart reloads the last state with
its optimizer and skips every recorded rollout, so nothing is trained twice.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from tinkertrace.online.settings import FollowOptions
from tinkertrace.online.tail import BackgroundTail, SpanTail
from tinkertrace.training import step as shared_step
from tinkertrace.training.backends import make_service_client
from tinkertrace.training.checkpoints import read_checkpoints
from tinkertrace.training.config import TrainConfig
from tinkertrace.training.dataset import group_keys
from tinkertrace.training.errors import ConfigError, DataError

FOLLOW_MODE = "follow"
StepCallback = Callable[[int, dict[str, Any]], None]
LAG_PARTS = ("arrive", "queue", "train")  # rollout end → built → its step starts → its step ends


class Publisher(Protocol):
    """Where the follow trainer states its demand and publishes each new policy version."""

    def demand(self, rollouts_per_step: int, max_staleness: int) -> None:
        """Before the first step: what the trainer consumes (the endpoint admits rollouts by it)."""

    def publish(self, record: dict[str, Any]) -> None:
        """A new version (a checkpoint record with its trained and dropped rollout ids)."""

    def withdraw(self) -> None:
        """The trainer stopped: the endpoint no longer holds new rollouts for it."""


def consumed_ids(record: dict[str, Any]) -> list[str]:
    """The rollouts a checkpoint record consumed: trained or dropped."""
    return [*record.get("trained_rollout_ids", []), *record.get("dropped_rollout_ids", [])]


@dataclass
class FollowResult:
    """What a follow run did."""

    log_dir: Path
    start_step: int
    steps: int = 0
    rollouts_trained: int = 0
    rollouts_dropped_stale: int = 0
    rollouts_dropped_constant: int = 0
    lags_s: list[float] = field(default_factory=list)
    lag_parts_s: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in LAG_PARTS})
    rewards: list[float] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    last_metrics: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass
class AdminPublisher:
    """Publish through a sampling endpoint's admin API (``tinkertrace serve --admin-token``):
    ``POST /admin/policy`` swaps the weights, ``POST /admin/admission`` feeds its admission gate."""

    url: str
    token: str | None = None

    def _post(self, path: str, body: dict[str, Any], ok: tuple[int, ...] = (200,)) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        response = httpx.post(self.url.rstrip("/") + path, json=body, headers=headers, timeout=60)
        if response.status_code not in ok:
            raise RuntimeError(
                f"publishing to {self.url}{path} failed: HTTP {response.status_code} {response.text[:200]}"
            )

    def demand(self, rollouts_per_step: int, max_staleness: int) -> None:
        body = {"rollouts_per_step": rollouts_per_step, "max_staleness": max_staleness}
        self._post("/admin/admission", body)

    def withdraw(self) -> None:
        import httpx

        with suppress(httpx.HTTPError, RuntimeError):  # an endpoint that is gone holds nothing back
            self._post("/admin/admission", {"withdraw": True})

    def publish(self, record: dict[str, Any]) -> None:
        body = {"model_path": record["sampler_path"], "version": record["policy_version"]}
        self._post("/admin/policy", body, ok=(200, 409))  # 409: that version or newer is served already
        self._post("/admin/admission", {"rollout_ids": consumed_ids(record)})


@dataclass
class HolderPublisher:
    """Publish into an in-process ``serving.policy.PolicyHolder`` (swap without dropping requests)
    and its admission gate."""

    holder: Any

    def demand(self, rollouts_per_step: int, max_staleness: int) -> None:
        self.holder.admission.set_demand(rollouts_per_step, max_staleness)

    def withdraw(self) -> None:
        self.holder.admission.withdraw()

    def publish(self, record: dict[str, Any]) -> None:
        from tinkertrace.serving.policy import StalePolicyError

        with suppress(StalePolicyError):
            self.holder.load(record["sampler_path"], record["policy_version"])
        self.holder.admission.consume(consumed_ids(record))


def admin_publisher(url: str, token: str | None) -> Publisher:
    """A :class:`Publisher` for a `tinkertrace serve` in another process."""
    return AdminPublisher(url, token)


def holder_publisher(holder: Any) -> Publisher:
    """A :class:`Publisher` for an endpoint served in this process."""
    return HolderPublisher(holder)


def _percentiles(values: list[float] | np.ndarray) -> tuple[float, float]:
    if len(values) == 0:
        return float("nan"), float("nan")
    p50, p95 = np.percentile(np.asarray(values, dtype=np.float64), [50, 95])
    return float(p50), float(p95)


class FollowTrainer:
    """Runs follow mode over ``config.source`` (a spans folder) until stopped or ``max_steps``."""

    def __init__(
        self,
        config: TrainConfig,
        options: FollowOptions | None = None,
        *,
        publish: Publisher | None = None,
        service: Any = None,
        on_step: StepCallback | None = None,
    ) -> None:
        self.config = config.validate()
        self.options = (options or FollowOptions()).validate()
        if config.source is None:
            raise ConfigError("follow mode needs a spans folder to follow")
        if publish is None and self.options.publish_url:
            publish = admin_publisher(self.options.publish_url, self.options.publish_token)
        self.publish = publish
        self.service = service
        self.on_step = on_step
        self.buffer = pa.table({})
        self._arrived: dict[str, float] = {}
        self.consumed: set[str] = set()  # rollouts trained or dropped (recorded in checkpoints)

    # --- data ----------------------------------------------------------------------------------------
    def add(self, table: pa.Table) -> None:
        """Buffer newly built trajectories for training.

        This is the hook for subclasses that hold back or rebuild rows first (the examples stage
        each environment's groups until complete): override it and call ``super().add(rows)``.
        It is also called with an empty table on polls that found nothing new. Rows of rollouts
        already trained or dropped (this run or, after a restart, a recorded one) are left out here,
        whatever a subclass rebuilt: nothing is trained twice.
        """
        if table.num_rows and self.consumed:
            consumed = pa.array(sorted(self.consumed), pa.string())
            table = table.filter(pc.invert(pc.is_in(table["rollout_id"], value_set=consumed)))
        if table.num_rows == 0:
            return
        now = time.time()
        for rid in pc.unique(table["rollout_id"]).to_pylist():
            self._arrived.setdefault(rid, now)
        self.buffer = table if self.buffer.num_columns == 0 else pa.concat_tables([self.buffer, table])

    def _drop_stale(self, step: int) -> list[str]:
        """Remove rollouts older than ``max_staleness`` versions (drop mode); their ids."""
        o = self.options
        if o.max_staleness is None or o.staleness_mode != "drop" or self.buffer.num_rows == 0:
            return []
        version = pc.fill_null(self.buffer["policy_version"], step)
        stale = pc.greater(pc.subtract(pa.scalar(step, pa.int64()), version), o.max_staleness)
        ids = pc.unique(pc.filter(self.buffer["rollout_id"], stale)).to_pylist()
        if ids:
            self.buffer = self.buffer.filter(pc.invert(stale))
        return ids

    def _select(self) -> tuple[pa.Table, list[str]] | None:
        """The rows of the groups to train now (and their ids), or None to keep waiting."""
        if self.buffer.num_rows == 0:
            return None
        o, now = self.options, time.time()
        keys = group_keys(self.buffer, self.config.group_by)
        arrived = pa.array([self._arrived[r] for r in self.buffer["rollout_id"].to_pylist()], pa.float64())
        frame = pa.table({"key": keys, "rollout_id": self.buffer["rollout_id"], "arrived": arrived})
        groups = frame.group_by("key").aggregate([("rollout_id", "count_distinct"), ("arrived", "min")])
        waited = now - groups["arrived_min"].to_numpy()
        count = groups["rollout_id_count_distinct"].to_numpy()
        ready = (count >= o.group_size) | ((count >= 2) & (waited >= o.group_timeout_s))
        if not ready.any():
            return None
        order = np.argsort(-waited[ready], kind="stable")
        if ready.sum() < self.config.groups_per_batch and waited[ready].max() < o.group_timeout_s:
            return None
        chosen = groups["key"].take(pa.array(np.flatnonzero(ready)[order][: self.config.groups_per_batch]))
        mask = pc.is_in(keys, chosen)
        selected = self.buffer.filter(mask)
        self.buffer = self.buffer.filter(pc.invert(mask))
        return selected, pc.unique(selected["rollout_id"]).to_pylist()

    # --- run -----------------------------------------------------------------------------------------
    @contextmanager
    def _demand_stated(self) -> Iterator[None]:
        """While training: the endpoint published to starts only the rollouts this trainer will take
        within ``max_staleness`` versions (its admission gate); withdrawn when the run ends."""
        o = self.options
        if self.publish is None or not o.admission or o.max_staleness is None:
            yield
            return
        self.publish.demand(self.config.groups_per_batch * o.group_size, o.max_staleness)
        try:
            yield
        finally:
            self.publish.withdraw()

    def _resume(self) -> tuple[int, dict[str, Any] | None, set[str]]:
        records = read_checkpoints(self.config.log_dir)
        if not records:
            return 0, None, set()
        batch = [r["name"] for r in records if r.get("mode") != FOLLOW_MODE]
        if batch:
            raise ConfigError(
                f"{self.config.log_dir} holds checkpoints of a batch run ({batch[-1]}): "
                "follow mode needs its own --log-dir"
            )
        done = {rid for r in records for rid in consumed_ids(r)}
        return int(records[-1]["step"]), records[-1], done

    def run(
        self, stop: threading.Event | None = None, console: Console | None = None, progress: bool = True
    ) -> FollowResult:
        """Follow until ``stop`` is set, ``max_steps`` is reached, or ``idle_timeout_s`` passes idle.

        The demand is stated first, so agents started with the trainer sample no more than it takes
        while it opens its training client."""
        with self._demand_stated():
            return self._follow(stop or threading.Event(), console, progress)

    def _follow(self, stop: threading.Event, console: Console | None, progress: bool) -> FollowResult:
        config, o = self.config, self.options
        log_dir = Path(config.log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        step, resume_from, done = self._resume()
        self.consumed |= done
        (log_dir / "config.json").write_text(
            json.dumps({**config.to_dict(), "follow": dict(vars(o), publish_token=None)}, indent=2)
        )
        service = self.service or make_service_client(config.backend, engine_dir=config.engine_dir)
        training_client = shared_step.open_training_client(service, config, resume_from)
        if resume_from is not None and self.publish is not None:
            self.publish.publish(resume_from)
        adam = shared_step.adam_params(config)
        tail = SpanTail(Path(config.source), resolved=set(done), group_by=config.group_by)  # type: ignore[arg-type]
        result = FollowResult(log_dir=log_dir, start_step=step, steps=step)
        dropped_since_save: list[str] = []
        started = last_activity = time.monotonic()
        logger = shared_step.open_metrics_logger(config, log_dir, step)
        result.notes.extend(logger.notes)
        bar = _follow_progress(progress, console)
        feed = BackgroundTail(tail, o.poll_s)
        with logger, feed, bar if bar is not None else nullcontext():
            task = (
                bar.add_task("follow", total=o.max_steps, completed=step, status="waiting for rollouts")
                if bar
                else None
            )
            while not stop.is_set() and (o.max_steps is None or step < o.max_steps):
                polls = feed.take()
                for polled in polls:
                    result.notes.extend(f"skipped span file {s}" for s in polled.skipped_files)
                    for rid in pc.unique(polled.trajectories["rollout_id"]).to_pylist():
                        self._arrived.setdefault(rid, polled.built_at)
                    self.add(polled.trajectories)
                stale = self._drop_stale(step)
                result.rollouts_dropped_stale += len(stale)
                dropped_since_save.extend(stale)
                if any(p.rollouts_built for p in polls) or stale:
                    last_activity = time.monotonic()
                picked = self._select()
                if picked is None:
                    if o.idle_timeout_s is not None and time.monotonic() - last_activity > o.idle_timeout_s:
                        result.notes.append(f"stopped: no new rollouts for {o.idle_timeout_s:.0f}s")
                        break
                    feed.wait(o.poll_s)
                    continue
                table, ids = picked
                step_started = time.monotonic()
                metrics = self._train(
                    training_client, adam, table, step, result, dropped_since_save, stale, time.time()
                )
                if metrics is None:
                    continue
                record = {
                    "epoch": 0,
                    "mode": FOLLOW_MODE,
                    "policy_version": step + 1,
                    "trained_rollout_ids": sorted(ids),
                    "dropped_rollout_ids": sorted(dropped_since_save),
                    "seed": config.seed,
                    "groups_per_batch": config.groups_per_batch,
                }
                saved = shared_step.save_checkpoint(training_client, log_dir, step + 1, record)
                for rid in consumed_ids(record):
                    self.consumed.add(rid)
                    self._arrived.pop(rid, None)  # dropped rollouts' arrival times too
                dropped_since_save.clear()
                published = time.monotonic()
                if self.publish is not None:
                    self.publish.publish(saved)
                metrics["time/publish"] = time.monotonic() - published
                result.checkpoints.append(saved)
                metrics["time/step"] = time.monotonic() - step_started
                metrics["time/total"] = time.monotonic() - started
                logger.log(step, metrics)
                step += 1
                last_activity = time.monotonic()
                result.steps, result.last_metrics = step, metrics
                result.rewards.append(float(metrics["env/all/reward/total"]))
                if bar is not None and task is not None:
                    bar.update(task, completed=step, status=_status(metrics))
                if self.on_step is not None:
                    self.on_step(step, metrics)
        if result.rollouts_dropped_stale:
            result.notes.append(
                f"dropped {result.rollouts_dropped_stale} rollouts sampled more than "
                f"{o.max_staleness} policy versions before the step that would train them (stale)"
            )
        return result

    def _train(
        self,
        client: Any,
        adam: Any,
        table: pa.Table,
        step: int,
        result: FollowResult,
        dropped: list[str],
        stale_now: list[str],
        started_at: float,
    ) -> dict[str, Any] | None:
        """One step on ``table``; None when nothing in it could be trained (constant-reward groups)."""
        config, o = self.config, self.options
        try:
            data = shared_step.prepare_data(table, config)
        except DataError:
            ids = pc.unique(table["rollout_id"]).to_pylist()
            result.rollouts_dropped_constant += len(ids)
            dropped.extend(ids)
            return None
        kept = set(pc.unique(data.table["rollout_id"]).to_pylist())
        constant = sorted(set(pc.unique(table["rollout_id"]).to_pylist()) - kept)
        result.rollouts_dropped_constant += len(constant)
        dropped.extend(constant)
        versions = self._versions(table, data.table, step)
        age = step - versions
        if o.max_staleness is not None and o.staleness_mode == "downweight":
            over = np.clip(age - o.max_staleness, 0, None)
            data.advantage_of_row = data.advantage_of_row * o.staleness_decay**over
        rows = np.arange(data.table.num_rows)
        batch = shared_step.build_batch(data, rows, config)
        metrics: dict[str, Any] = {
            "progress/batch": step,
            "progress/epoch": 0,
            "optim/lr": config.learning_rate,
            **shared_step.batch_metrics(data, rows, batch),
        }
        if batch.data:
            metrics.update(shared_step.train_step(client, batch, config, adam))
        lags, parts = self._lags(table, kept, started_at)
        result.lags_s.extend(lags)
        for name, values in parts.items():
            result.lag_parts_s[name].extend(values)
            metrics[f"lag/{name}_p95_s"] = _percentiles(values)[1]
        result.rollouts_trained += len(kept)
        p50, p95 = _percentiles(lags)
        metrics.update(
            {
                "lag/rollout_to_trained_p50_s": p50,
                "lag/rollout_to_trained_p95_s": p95,
                "lag/staleness_mean": float(age.mean()) if len(age) else 0.0,
                "lag/staleness_max": int(age.max()) if len(age) else 0,
                "follow/rollouts_trained": len(kept),
                "follow/dropped_stale": len(stale_now),
                "follow/dropped_stale_total": result.rollouts_dropped_stale,
                "follow/dropped_constant_total": result.rollouts_dropped_constant,
                "follow/buffered_rows": self.buffer.num_rows,
            }
        )
        return metrics

    @staticmethod
    def _versions(source: pa.Table, rows: pa.Table, step: int) -> np.ndarray:
        """Policy version of each row of ``rows`` (a prepared table), looked up by rollout id in
        ``source``; a rollout's version is the oldest of its calls, unknown counts as current."""
        per = source.group_by("rollout_id").aggregate([("policy_version", "min")])
        index = pc.index_in(rows["rollout_id"], value_set=per["rollout_id"])
        versions = pc.take(per["policy_version_min"], index)
        return np.asarray(pc.fill_null(versions, step).to_numpy(zero_copy_only=False), dtype=np.int64)

    def _lags(
        self, table: pa.Table, kept: set[str], step_started: float
    ) -> tuple[list[float], dict[str, list[float]]]:
        """Seconds from each kept rollout's end to now, and that lag's parts (:data:`LAG_PARTS`):
        until it was built from the spans, then until its step started, then the step."""
        per = table.group_by("rollout_id").aggregate([("end_time", "max")])
        per = per.filter(pc.is_in(per["rollout_id"], pa.array(sorted(kept), pa.string())))
        per = per.filter(pc.is_valid(per["end_time_max"]))
        ends = pc.cast(per["end_time_max"], pa.int64()).to_numpy(zero_copy_only=False) / 1e9
        arrived = np.array([self._arrived.pop(r) for r in per["rollout_id"].to_pylist()], dtype=np.float64)
        now = time.time()
        parts = {"arrive": arrived - ends, "queue": step_started - arrived, "train": now - step_started}
        return (now - ends).tolist(), {k: np.broadcast_to(v, ends.shape).tolist() for k, v in parts.items()}


def _status(metrics: dict[str, Any]) -> str:
    return (
        f"reward {metrics['env/all/reward/total']:.3f}  loss {metrics.get('loss:sum', float('nan')):.3f}  "
        f"lag p50 {metrics['lag/rollout_to_trained_p50_s']:.1f}s"
    )


def _follow_progress(enabled: bool, console: Console | None) -> Progress | None:
    if not enabled:
        return None
    return Progress(
        SpinnerColumn(),
        TextColumn("[bold]train --follow[/] step {task.completed}"),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console,
    )
