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

Exactly-once: every step is checkpointed with its rollout ids; a restart reloads the last state with
its optimizer and skips every recorded rollout, so nothing is trained twice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console

from tinkertrace.online.group_staging import GroupStager, pick_groups, rollouts_per_step
from tinkertrace.online.lag import LAG_PARTS, follow_progress, follow_status, step_lags
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
from tinkertrace.online.staleness import (
    VERSIONS_COLUMN,
    correct_batch,
    rollout_ages,
    row_ages,
    stale_rows,
    staleness_metrics,
    target_ages,
)
from tinkertrace.online.tail import BackgroundTail, SpanTail, TailPoll
from tinkertrace.serving.admission import Demand
from tinkertrace.settings import ConfigError
from tinkertrace.training.checkpoints import read_checkpoints
from tinkertrace.training.config import TrainSettings
from tinkertrace.training.dataset import DataReport, TrainingData, group_keys
from tinkertrace.training.environments import WeightedTurns
from tinkertrace.training.errors import DataError
from tinkertrace.training.outcomes import DROPPED, outcome_rows
from tinkertrace.training.step import TrainingSession, prepare_data

CORRECT_WITHOUT_SUBSTEPS = (
    "correct mode with --num-substeps 1: its clip never acts (each step takes one optimiser step, at "
    "the policy the clip is measured from); 2-4 substeps bound each step (docs/online.md)"
)

FOLLOW_MODE = "follow"
CARRIED_GROUPS = 1024
"""Groups trained short of ``group_size`` whose rows are kept as their late rollouts' baseline, at most
(the oldest are forgotten first)."""
StepCallback = Callable[[int, dict[str, Any]], None]


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
    environments: dict[str, dict[str, int]] = field(default_factory=dict)  # per environment: what was built


def reward_only(rows: pa.Table) -> pa.Table:
    """``rows`` with their token lists emptied: all a baseline needs (keys and rewards), and small."""
    for name in ("tokens", "logprobs", "action_mask", VERSIONS_COLUMN):
        if name in rows.column_names:
            field = rows.schema.field(name)
            rows = rows.set_column(
                rows.column_names.index(name), field, pa.array([[]] * rows.num_rows, field.type)
            )
    return rows


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
        self.buffer = pa.table({})
        self._arrived: dict[str, float] = {}
        self.consumed: set[str] = set()  # rollouts trained or dropped (recorded in checkpoints)
        self._dropped_since_save: list[str] = []  # dropped, to be recorded with the next checkpoint
        self._drops_reported = 0  # how many of those the endpoint's gate was told of
        self._last_publish_s = float("nan")  # seconds the last publication took (logged with the next step)
        self._published: dict[str, Any] | None = None  # the checkpoint record published last
        self._stale_now: list[str] = []  # dropped as stale by the latest poll
        self._drop_records: list[dict[str, Any]] = []  # outcome records of those drops (outcomes.jsonl)
        self._stale_groups: set[str] = set()  # correct mode: groups dropped whole (later rollouts too)
        self._carried: dict[str, pa.Table] = {}  # group trained short of its size → its rows (a baseline)
        self._waiting_since: float | None = None  # the trainer idle with rollouts buffered, since
        self._stated: StatedDemand | None = None  # the demand held at the endpoint (while running)
        envs = self.config.environments
        self.stager = GroupStager(envs, Path(config.source), self.options.group_timeout_s) if envs else None
        self.turns = WeightedTurns([env.weight for env in envs]) if envs else None

    # --- data ----------------------------------------------------------------------------------------
    def add(self, table: pa.Table) -> None:
        """Buffer newly built trajectories for training.

        With environments, the rows come from the :class:`GroupStager` (whole groups, built with their
        environment's settings). Rows of rollouts already trained or dropped (this run or, after a
        restart, a recorded one) are left out here: nothing is trained twice.
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
        """Remove rollouts older than ``max_staleness`` versions from the buffer (drop mode; in
        correct mode whole groups with nothing left to train); their ids."""
        o = self.options
        if o.max_staleness is None or o.staleness_mode == "downweight" or self.buffer.num_rows == 0:
            return []
        keys = group_keys(self.buffer, self.config.group_by)
        over = stale_rows(self.buffer, keys, step, o.max_staleness, o.staleness_mode, self._stale_groups)
        if not over.any():
            return []
        stale = pa.array(over)
        ids = self._record_stale(self.buffer.filter(stale), step)
        self.buffer = self.buffer.filter(pc.invert(stale))
        return ids

    def _record_stale(self, rows: pa.Table, step: int) -> list[str]:
        """The outcome records of ``rows`` (whole rollouts) dropped as stale at ``step``; their ids."""
        behind = rollout_ages(rows, step).tolist()
        self._drop_records += outcome_rows(rows, DROPPED, step=step, reason="stale", versions_behind=behind)
        return pc.unique(rows["rollout_id"]).to_pylist()

    def _count_stale(self, ids: list[str], result: FollowResult) -> None:
        """Count ``ids`` as dropped stale: the run's figure, this poll's and step's, and the ids the
        next checkpoint and the endpoint's gate are told of."""
        result.rollouts_dropped_stale += len(ids)
        self._dropped_since_save.extend(ids)
        self._stale_now.extend(ids)

    def _select(self, step: int) -> tuple[pa.Table, list[str]] | None:
        """The rows of the groups to train at ``step`` (and their ids), or None to keep waiting."""
        if self.buffer.num_rows == 0:
            return None
        keys = group_keys(self.buffer, self.config.group_by)
        arrived = pa.array([self._arrived[r] for r in self.buffer["rollout_id"].to_pylist()], pa.float64())
        names = [env.name for env in self.config.environments]
        bounded = self.options.max_staleness is not None and self.turns is None
        ages = row_ages(self.buffer, step) if bounded else None  # nearest the bound first
        chosen = pick_groups(
            keys,
            self.buffer,
            arrived,
            self.options,
            self.config.groups_per_batch,
            self.turns,
            names,
            ages,
            carried=self._carried.keys(),
        )
        if chosen is None:
            return None
        mask = pc.is_in(keys, chosen)
        selected = self.buffer.filter(mask)
        self.buffer = self.buffer.filter(pc.invert(mask))
        return selected, pc.unique(selected["rollout_id"]).to_pylist()

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
        self.consumed |= {rid for r in records for rid in consumed_ids(r)}
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
        tail = SpanTail(source, resolved=set(self.consumed), group_by=self.config.group_by)
        with (
            BackgroundTail(tail, o.poll_s) as feed,
            follow_progress(console, progress, o.max_steps, result.steps) as bar,
        ):
            idle_since = time.monotonic()
            while not stop.is_set() and not self._done(result):
                if self._collect(feed.take(), result):
                    idle_since = time.monotonic()
                self._write_drops(session)
                self._report_drops()
                picked = self._select(result.steps)
                if picked is None:
                    if self._waiting_since is None and (self.buffer.num_rows or self._staged()):
                        self._waiting_since = time.monotonic()  # data waits for the rest of a batch
                    if self._idle_too_long(idle_since, result):
                        return
                    feed.wait(o.poll_s)
                elif self._step(session, *picked, result):
                    self._write_drops(session)
                    idle_since = time.monotonic()
                    bar.update(completed=result.steps, status=follow_status(result.last_metrics))
                    if self.on_step is not None:
                        self.on_step(result.steps, result.last_metrics)

    def _report_drops(self) -> None:
        """Tell the endpoint's gate of the rollouts dropped since the last report. A step's drops
        otherwise reach it with the step's publication, and a batch of constant-reward groups trains
        no step: a gate full of such rollouts would hold every rollout the next step needs."""
        new = self._dropped_since_save[self._drops_reported :]
        if new and self.publish is not None:
            self.publish.consume(new)
        self._drops_reported = len(self._dropped_since_save)

    def _staged(self) -> bool:
        return self.stager is not None and bool(self.stager.arrived)

    def _write_drops(self, session: TrainingSession) -> None:
        """Record the rows dropped since the last call in ``outcomes.jsonl`` now: a stale drop after
        the run's last step has no checkpoint to go with, and must not go unrecorded."""
        session.outcomes.write(self._drop_records)
        self._drop_records = []

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
            for rid in pc.unique(polled.trajectories["rollout_id"]).to_pylist():
                self._arrived.setdefault(rid, polled.built_at)
            if self.stager is None:
                self.add(polled.trajectories)
            else:
                self.stager.stage(polled.trajectories, polled.files)
        if self.stager is not None:
            self.add(self.stager.release(self.consumed))
            result.environments = self.stager.stats
        self._stale_now = []
        self._count_stale(self._drop_stale(result.steps), result)
        return any(p.rollouts_built for p in polls) or bool(self._stale_now)

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
            "dropped_rollout_ids": sorted(self._dropped_since_save),
            "seed": self.config.seed,
            "groups_per_batch": self.config.groups_per_batch,
        }
        # the metrics line goes before the checkpoint (a crash in between repeats the step on resume,
        # which rewrites its line), so it carries the previous step's publication time
        metrics["time/publish"] = self._last_publish_s
        session.log(step, metrics, started)
        saved = session.checkpoint(step + 1, record)
        self._consume(consumed_ids(record))
        self._dropped_since_save.clear()
        self._drops_reported = 0
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
        late = self._late_in(table)
        prepared = self._prepare(table, step, result)
        self._carry(table)  # trained or dropped, its groups' rewards are their late rollouts' baseline
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
        metrics.update(step_lags(table, kept, self._arrived, started_at, result.lags_s, result.lag_parts_s))
        result.rollouts_trained += len(kept)
        metrics.update(
            {
                "lag/staleness_mean": float(age.mean()) if len(age) else 0.0,
                "lag/staleness_max": int(age.max()) if len(age) else 0,
                "follow/rollouts_trained": len(kept),
                "follow/late_rollouts": late,
                "follow/dropped_stale": len(self._stale_now),
                "follow/dropped_stale_total": result.rollouts_dropped_stale,
                "follow/dropped_constant_total": result.rollouts_dropped_constant,
                "follow/buffered_rows": self.buffer.num_rows,
            }
        )
        return metrics, kept

    def _prepare(
        self, table: pa.Table, step: int, result: FollowResult
    ) -> tuple[TrainingData, np.ndarray, set[str], np.ndarray] | None:
        """``table`` as training data (constant-reward groups dropped and counted, stale rows
        downweighted), the rows to train (the rows of ``table``: a late rollout's group's earlier
        rows join the data only for its baseline), the rollouts kept, and each row's age in versions;
        None if nothing is left."""
        o = self.options
        ids = set(pc.unique(table["rollout_id"]).to_pylist())
        baseline = self._baseline_of(table)
        report = DataReport()
        try:
            whole = pa.concat_tables([table, baseline], promote_options="default") if baseline else table
            data: TrainingData | None = prepare_data(whole, self.config, report)
        except DataError:  # every group had a constant reward
            data = None
        self._drop_records += [{**r, "step": step} for r in report.dropped if r["rollout_id"] in ids]
        rows, kept, spent = np.zeros(0, dtype=np.int64), set[str](), list[str]()
        if data is not None:
            own = pc.is_in(data.table["rollout_id"], pa.array(sorted(ids), pa.string()))
            rows = np.flatnonzero(own.to_numpy(zero_copy_only=False))
            if o.staleness_mode == "correct" and o.max_staleness is not None:
                rows, spent = self._without_spent(data.table, rows, step, o.max_staleness, result)
            kept = set(pc.unique(data.table["rollout_id"].take(rows)).to_pylist())
        constant = ids - kept - set(spent)
        result.rollouts_dropped_constant += len(constant)
        self._dropped_since_save.extend(sorted(constant))
        if data is None or not kept:
            return None
        age = row_ages(data.table, step)
        if o.max_staleness is not None and o.staleness_mode == "downweight":
            over = np.clip(age - o.max_staleness, 0, None)
            data.advantage_of_row = data.advantage_of_row * o.staleness_decay**over
        return data, rows, kept, age[rows]

    def _without_spent(
        self, table: pa.Table, rows: np.ndarray, step: int, bound: int, result: FollowResult
    ) -> tuple[np.ndarray, list[str]]:
        """Correct mode: ``rows`` without the rollouts wholly over ``bound`` (their newest token too),
        and those rollouts. Their rewards are already in their group's advantages (its baseline); they
        train nothing, so they are dropped as stale, not sent to the trainer."""
        spent = rollout_ages(table, step, newest=True)[rows] > bound
        if not spent.any():
            return rows, []
        ids = self._record_stale(table.take(rows[spent]), step)
        self._count_stale(ids, result)
        return rows[~spent], ids

    # --- late rollouts: a group trained without some of its rollouts keeps its rows as their baseline ---
    def _late_in(self, table: pa.Table) -> int:
        """Rollouts of ``table`` whose group was trained before without them."""
        keys = group_keys(table, self.config.group_by)
        late = pc.fill_null(pc.is_in(keys, pa.array(sorted(self._carried), keys.type)), False)
        return len(pc.unique(table["rollout_id"].filter(late)))

    def _baseline_of(self, table: pa.Table) -> pa.Table | None:
        """The earlier rows of ``table``'s carried groups, or None."""
        keys = pc.unique(group_keys(table, self.config.group_by)).to_pylist()
        earlier = [self._carried[k] for k in keys if k in self._carried]
        return pa.concat_tables(earlier, promote_options="default") if earlier else None

    def _carry(self, table: pa.Table) -> None:
        """After a step on ``table``: keep the rows of each group still short of ``group_size`` (its
        late rollouts' baseline), forget the groups now whole. Not with environments (their stager
        releases whole groups)."""
        if self.stager is not None:
            return
        keys = group_keys(table, self.config.group_by)
        for key in pc.unique(keys).drop_null().to_pylist():
            rows = table.filter(pc.fill_null(pc.equal(keys, key), False))
            earlier = self._carried.pop(key, None)
            if earlier is not None:
                rows = pa.concat_tables([earlier, rows], promote_options="default")
            if len(pc.unique(rows["rollout_id"])) < self.options.group_size:
                self._carried[key] = reward_only(rows)
        while len(self._carried) > CARRIED_GROUPS:
            self._carried.pop(next(iter(self._carried)))

    def _consume(self, ids: Iterable[str]) -> None:
        """Mark rollouts trained or dropped; their arrival times go once none of their rows is left
        in the buffer (grouped by task+agent, a rollout's other agents may still wait for a step)."""
        waiting = set(self.buffer["rollout_id"].to_pylist()) if self.buffer.num_rows else set()
        for rid in ids:
            self.consumed.add(rid)
            if rid not in waiting:
                self._arrived.pop(rid, None)
