"""Tail-follow training: train on rollouts as their spans arrive, publish each new policy version.

Each poll builds only new complete rollouts (:class:`~tinkertrace.online.tail.SpanTail`, polled on
its own thread so building overlaps training) into a buffer. A group (the GRPO group key) is ready
once it holds ``group_size`` rollouts, or at least two after waiting ``group_timeout_s``. When
``groups_per_batch`` groups are ready (or the oldest ready one waited ``group_timeout_s``) one step
runs: advantages and Datums as in batch mode (the shared step of ``training.step``), then a
checkpoint whose record lists the rollouts trained (and dropped), then the new weights are published
as policy version = steps, in the form the endpoint takes
(:func:`~tinkertrace.online.publish.publish_version`: the checkpoint's sampler path, or on hosted
Tinker an inflight sampling client).

Staleness: a token sampled by policy version ``v`` is ``step - v`` versions old at training time, a
row as old as its oldest token (:mod:`tinkertrace.online.staleness`). Beyond ``max_staleness`` a
rollout is dropped (``staleness_mode="drop"``); the bound is per token, every token within it trained
with the decoupled-PPO correction, a group's advantages taken over all of it (a rollout wholly over the
bound lends its reward to the baseline, and is then dropped as stale) and a group dropped whole only
when nothing in it is left to train (``"correct"``, formula in
:mod:`tinkertrace.training.offpolicy`); or its advantage is scaled by
``staleness_decay ** (age - max_staleness)`` (``"downweight"``). Dropped counts are logged, and each
step logs its ``offpolicy/…`` metrics (staleness histograms, sampler/trainer mismatch KL, truncated
and clipped shares, multi-version rollouts, seconds spent waiting for stragglers).
Staleness is bounded at the source too: the trainer states its demand (rollouts per step, max
staleness) to the endpoint it publishes to, whose admission gate starts only as many new rollouts
as the trainer will consume in time (:mod:`tinkertrace.serving.admission`).

Late rollouts: a group trained short of ``group_size`` (after ``group_timeout_s``) keeps its rows'
keys and rewards; a straggler of it arriving later joins the next step beyond ``groups_per_batch``,
its advantage taken against the whole group's mean reward.

The parts: :mod:`~tinkertrace.online.follow_buffer` (the buffer and group selection),
:mod:`~tinkertrace.online.follow_data` (a step's training data), :mod:`~tinkertrace.online.drop_ledger`
(drop and staleness accounting), :mod:`~tinkertrace.online.late_rollouts` (late-rollout carrying).

Exactly-once: every step is checkpointed with its rollout ids; a restart reloads the last state with
its optimizer and skips every recorded rollout, so nothing is trained twice.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console

from tinkertrace.online.drop_ledger import DropLedger
from tinkertrace.online.follow_buffer import FollowBuffer
from tinkertrace.online.follow_data import StepData
from tinkertrace.online.follow_result import FollowResult
from tinkertrace.online.group_staging import GroupStager, rollouts_per_step
from tinkertrace.online.lag import follow_progress, follow_status, step_lags
from tinkertrace.online.late_rollouts import CARRIED_GROUPS, LateRollouts, reward_only
from tinkertrace.online.publish import (
    Publisher,
    StatedDemand,
    admin_publisher,
    consumed_ids,
    demand_stated,
    hand_back,
    publish_version,
)
from tinkertrace.online.settings import FollowSettings
from tinkertrace.online.staleness import correct_batch, staleness_metrics, target_ages
from tinkertrace.online.tail import BackgroundTail, SpanTail, TailPoll
from tinkertrace.serving.admission import Demand
from tinkertrace.settings import ConfigError
from tinkertrace.training.checkpoints import read_checkpoints
from tinkertrace.training.config import TrainSettings
from tinkertrace.training.environments import WeightedTurns
from tinkertrace.training.errors import DataError
from tinkertrace.training.step import TrainingSession
from tinkertrace.training.trainability import GroupTally, TrainabilityWatch, WatchLimits, announce

__all__ = [
    "CARRIED_GROUPS",
    "CORRECT_WITHOUT_SUBSTEPS",
    "FOLLOW_MODE",
    "FollowResult",
    "FollowTrainer",
    "StepCallback",
    "reward_only",
]

CORRECT_WITHOUT_SUBSTEPS = (
    "correct mode with --num-substeps 1: its clip never acts (each step takes one optimiser step, at "
    "the policy the clip is measured from); 2-4 substeps bound each step (docs/online.md)"
)

FOLLOW_MODE = "follow"
StepCallback = Callable[[int, dict[str, Any]], None]


def untrainable_limits(options: FollowSettings) -> WatchLimits:
    """The trainability watch's limits: the ``untrainable_*`` settings (giving up only with ``max_steps``:
    a service without it keeps going, and keeps warning)."""
    limited = options.max_steps is not None
    return WatchLimits(
        warn_groups=options.untrainable_warn_groups,
        warn_s=options.untrainable_warn_s,
        repeat_s=options.untrainable_repeat_s,
        give_up_groups=options.untrainable_give_up_groups if limited else None,
        give_up_s=options.untrainable_give_up_s if limited else None,
    )


class FollowTrainer:
    """Runs follow mode over ``config.source`` (a spans folder) until stopped or ``max_steps``."""

    def __init__(
        self,
        config: TrainSettings,
        options: FollowSettings | None = None,
        *,
        publish: Publisher | None = None,
        service: Any = None,
        on_step: StepCallback | None = None,
    ) -> None:
        self.config = config.validate()
        self.options = (options or FollowSettings()).validate()
        if config.source is None:
            raise ConfigError("follow mode needs a spans folder to follow")
        if publish is None and self.options.publish_url:
            publish = admin_publisher(self.options.publish_url, self.options.publish_token)
        self.publish = publish
        self.service = service
        self.on_step = on_step
        self._last_publish_s = float("nan")  # seconds the last publication took (logged with the next step)
        self._published: dict[str, Any] | None = None  # the checkpoint record published last
        self._waiting_since: float | None = None  # the trainer idle with rollouts buffered, since
        self._stated: StatedDemand | None = None  # the demand held at the endpoint (while running)
        envs = self.config.environments
        self.stager = GroupStager(envs, Path(config.source), self.options.group_timeout_s) if envs else None
        turns = WeightedTurns([env.weight for env in envs]) if envs else None
        self.buffer = FollowBuffer(self.config, self.options, turns)
        self.late = LateRollouts(self.config.group_by, self.options.group_size, enabled=not envs)
        self.drops = DropLedger(self.options, self.config.group_by)
        self.watch = TrainabilityWatch(untrainable_limits(self.options))
        self.data = StepData(self.config, self.options, self.late, self.drops, self.watch)

    def _select(self, step: int) -> tuple[pa.Table, list[str]] | None:
        """The rows of the groups to train at ``step`` (and their ids), or None to keep waiting."""
        return self.buffer.select(step, carried=self.late.carried.keys())

    # --- run -----------------------------------------------------------------------------------------
    def run(
        self, stop: threading.Event | None = None, console: Console | None = None, progress: bool = True
    ) -> FollowResult:
        """Follow until ``stop`` is set, ``max_steps`` is reached, or ``idle_timeout_s`` passes idle.

        The demand is stated first, so agents started with the trainer sample no more than it takes
        while it opens its training client."""
        o, envs = self.options, self.config.environments
        per_step, group_size = self.config.groups_per_batch * o.group_size, o.group_size
        if envs:  # groups of different sizes: admitted rollout by rollout
            per_step = rollouts_per_step(envs, self.config.groups_per_batch)
            sizes = {env.group_size for env in envs}
            group_size = sizes.pop() if len(sizes) == 1 else 1
        publish = self.publish if o.admission else None
        demand = None if o.max_staleness is None else Demand(per_step, o.max_staleness, group_size)
        if demand is not None and o.max_steps is not None:  # a short run: no more than it will train
            demand = demand.for_steps_left(o.max_steps)
        with demand_stated(publish, demand) as self._stated:
            session, result = self._open()
            with session:
                try:
                    self._follow(session, result, stop or threading.Event(), console, progress)
                finally:  # while the session (and its inflight clients) still lives
                    if self.publish is not None and (note := hand_back(self.publish, self._published)):
                        result.notes.append(note)
        if self.stager is not None and self.stager.foreign:
            result.notes.append(f"left out {len(self.stager.foreign)} rollouts of no listed environment")
        if result.rollouts_dropped_stale:
            result.notes.append(
                f"dropped {result.rollouts_dropped_stale} rollouts sampled more than "
                f"{self.options.max_staleness} policy versions before the step that would train them (stale)"
            )
        return result

    def _open(self) -> tuple[TrainingSession, FollowResult]:
        """The training session, resumed from this log folder's last follow checkpoint if any (its
        rollouts are not trained again; its version is published again)."""
        records = read_checkpoints(self.config.log_dir)
        batch = [r["name"] for r in records if r.get("mode") != FOLLOW_MODE]
        if batch:
            raise ConfigError(
                f"{self.config.log_dir} holds checkpoints of a batch run ({batch[-1]}): "
                "follow mode needs its own --log-dir"
            )
        last = records[-1] if records else None
        step = int(last["step"]) if last else 0
        self.buffer.consumed |= {rid for r in records for rid in consumed_ids(r)}
        follow_settings = {"follow": dict(vars(self.options), publish_token=None)}
        session = TrainingSession(
            self.config, start_step=step, resume_from=last, service=self.service, extra_config=follow_settings
        )
        if last is not None and self.publish is not None:
            publish_version(self.publish, session.client, last)
            self._published = last
        result = FollowResult(log_dir=session.log_dir, start_step=step, steps=step, notes=list(session.notes))
        if self.options.staleness_mode == "correct" and self.config.num_substeps == 1:
            result.notes.append(CORRECT_WITHOUT_SUBSTEPS)
        return session, result

    def _follow(
        self,
        session: TrainingSession,
        result: FollowResult,
        stop: threading.Event,
        console: Console | None,
        progress: bool,
    ) -> None:
        """Poll, buffer, and train a step whenever enough groups are ready, until told to stop."""
        source, o = Path(self.config.source), self.options  # type: ignore[arg-type]
        tail = SpanTail(source, resolved=set(self.buffer.consumed), group_by=self.config.group_by)
        with (
            BackgroundTail(tail, o.poll_s) as feed,
            follow_progress(console, progress, o.max_steps, result.steps) as bar,
        ):
            idle_since = time.monotonic()
            while not stop.is_set() and not self._done(result):
                if self._collect(feed.take(), result):
                    idle_since = time.monotonic()
                self.drops.write(session)
                self.drops.report(self.publish)
                self._check_trainability(session, console, result)
                picked = self._select(result.steps)
                if picked is None:
                    if self._waiting_since is None and (self.buffer.num_rows or self._staged()):
                        self._waiting_since = time.monotonic()  # data waits for the rest of a batch
                    if self._idle_too_long(idle_since, result):
                        return
                    feed.wait(o.poll_s)
                elif self._step(session, *picked, result):
                    self.drops.write(session)
                    idle_since = time.monotonic()
                    bar.update(completed=result.steps, status=follow_status(result.last_metrics))
                    if self.on_step is not None:
                        self.on_step(result.steps, result.last_metrics)

    def _check_trainability(
        self, session: TrainingSession, console: Console | None, result: FollowResult
    ) -> None:
        """Warn when no group could be trained for a while (:mod:`~tinkertrace.training.trainability`);
        past the give-up limit (only with ``max_steps``), end the run with a :class:`DataError`."""
        alert = self.watch.check()
        if alert is None:
            return
        announce(alert, console, session.log_dir, result.steps)
        if alert.give_up:
            raise DataError(
                f"{alert.message}. Gave up short of --max-steps {self.options.max_steps} (the limits: "
                "--untrainable-give-up-groups, --untrainable-give-up-seconds)"
            )

    def _staged(self) -> bool:
        return self.stager is not None and bool(self.stager.arrived)

    def _done(self, result: FollowResult) -> bool:
        return self.options.max_steps is not None and result.steps >= self.options.max_steps

    def _idle_too_long(self, idle_since: float, result: FollowResult) -> bool:
        limit = self.options.idle_timeout_s
        if limit is None or time.monotonic() - idle_since <= limit:
            return False
        result.notes.append(f"stopped: no new rollouts for {limit:.0f}s")
        return True

    def _collect(self, polls: list[TailPoll], result: FollowResult) -> bool:
        """Buffer what the polls built and drop what went stale; whether anything happened."""
        for polled in polls:
            result.notes.extend(f"skipped span file {s}" for s in polled.skipped_files)
            built = pc.unique(polled.trajectories["rollout_id"]).to_pylist()
            self.buffer.note_arrival(built, polled.built_at)
            self._observe_rowless(polled.rollouts_built - len(built))
            if self.stager is None:
                self.buffer.add(polled.trajectories)
            else:
                self.stager.stage(polled.trajectories, polled.files)
        if self.stager is not None:
            self.buffer.add(self.stager.release(self.buffer.consumed))
            result.environments = self.stager.stats
        self.drops.stale_now = []
        self.drops.count_stale(self.drops.drop_stale(self.buffer, result.steps), result)
        return any(p.rollouts_built for p in polls) or bool(self.drops.stale_now)

    def _observe_rowless(self, rollouts: int) -> None:
        """Tell the watch of rollouts built without a trajectory row (no token ids), counted as groups of
        ``group_size`` (which task they ran is not known here)."""
        if rollouts > 0:
            groups = -(-rollouts // self.options.group_size)
            self.watch.observe(GroupTally(groups=groups, reasons=Counter(no_token_ids=groups)))

    def _step(self, session: TrainingSession, table: pa.Table, ids: list[str], result: FollowResult) -> bool:
        """Train on ``table`` (the rollouts ``ids``), checkpoint, publish; False when nothing in it
        could be trained (all its groups had a constant reward)."""
        started, step = time.monotonic(), result.steps
        trained = self._train(session, table, step, result)
        if trained is None:
            return False
        metrics, kept = trained
        record = {
            "epoch": 0,
            "mode": FOLLOW_MODE,
            "policy_version": step + 1,
            "trained_rollout_ids": sorted(kept),  # not its constant-reward groups: those are dropped
            "dropped_rollout_ids": sorted(self.drops.since_save),
            "seed": self.config.seed,
            "groups_per_batch": self.config.groups_per_batch,
        }
        # the metrics line goes before the checkpoint (a crash in between repeats the step on resume,
        # which rewrites its line), so it carries the previous step's publication time
        metrics["time/publish"] = self._last_publish_s
        session.log(step, metrics, started)
        saved = session.checkpoint(step + 1, record)
        self.buffer.consume(consumed_ids(record))
        self.drops.saved()
        published = time.monotonic()
        if self.publish is not None:
            publish_version(self.publish, session.client, saved)
            self._published = saved
        self._last_publish_s = time.monotonic() - published
        left = None if self.options.max_steps is None else self.options.max_steps - step - 1
        if self._stated is not None and left:  # the last steps: no more than they will train
            self._stated.restate(self._stated.demand.for_steps_left(left))
        result.checkpoints.append(saved)
        result.steps, result.last_metrics = step + 1, metrics
        result.rewards.append(float(metrics["env/all/reward/total"]))
        return True

    def _train(
        self, session: TrainingSession, table: pa.Table, step: int, result: FollowResult
    ) -> tuple[dict[str, Any], set[str]] | None:
        """One step on ``table``: its metrics and the rollouts it kept, or None when nothing in it
        could be trained."""
        started_at = time.time()
        late = self.late.late_in(table)
        prepared = self.data.prepare(table, step, result)
        self.late.carry(table)  # trained or dropped, its groups' rewards are their late rollouts' baseline
        if prepared is None:
            return None
        data, rows, kept, age = prepared
        waited = time.monotonic() - self._waiting_since if self._waiting_since is not None else 0.0
        self._waiting_since = None
        o = self.options
        correct = None
        if o.staleness_mode == "correct":
            correct = lambda client, batch, ages: correct_batch(  # noqa: E731
                client, batch, self.config.loss, o.staleness_cap, ages, o.max_staleness
            )
        ages = lambda taken, batch: target_ages(taken, batch, step)  # noqa: E731
        _, metrics = session.step(
            data, rows, step, {"progress/epoch": 0}, before_train=correct, token_ages=ages
        )
        metrics.update(staleness_metrics(data.table.take(rows), step))
        metrics["offpolicy/straggler_wait_s"] = waited
        metrics.update(
            step_lags(table, kept, self.buffer.arrived, started_at, result.lags_s, result.lag_parts_s)
        )
        result.rollouts_trained += len(kept)
        metrics.update(
            {
                "lag/staleness_mean": float(age.mean()) if len(age) else 0.0,
                "lag/staleness_max": int(age.max()) if len(age) else 0,
                "follow/rollouts_trained": len(kept),
                "follow/late_rollouts": late,
                "follow/dropped_stale": len(self.drops.stale_now),
                "follow/dropped_stale_total": result.rollouts_dropped_stale,
                "follow/dropped_constant_total": result.rollouts_dropped_constant,
                "follow/buffered_rows": self.buffer.num_rows,
            }
        )
        return metrics, kept
