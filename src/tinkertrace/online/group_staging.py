"""Follow mode over several environments: each group held until complete, then shared out by weight.

:class:`GroupStager` holds each group (the rollouts of one ``ENV/TASK/ROUND`` task id) until it holds
its environment's ``group_size`` rollouts, or has waited ``group_timeout_s``; then builds the whole
group with its environment's build options and reward settings
(:func:`~tinkertrace.training.environments.environment_rows`), so ``max_failing_rollouts`` sees the
whole group. :func:`pick_groups` picks a step's groups: the oldest ready ones, or (with environments)
by each environment's weight (:func:`select_by_weight`).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from tinkertrace import schemas
from tinkertrace.training.config import Environment
from tinkertrace.training.environments import (
    STAT_KEYS,
    WeightedTurns,
    env_of,
    environment_rows,
    group_environments,
)

if TYPE_CHECKING:
    import numpy as np


class GroupStager:
    """Holds the new rollouts of each group until the group is complete, then builds it."""

    def __init__(self, environments: Sequence[Environment], spans_dir: Path, timeout_s: float) -> None:
        self.envs = {env.name: env for env in environments}
        self.spans_dir = Path(spans_dir)
        self.timeout_s = timeout_s
        self.arrived: dict[str, set[str]] = {}  # task id → rollouts built so far
        self.first_seen: dict[str, float] = {}
        self.files: dict[str, set[Path]] = {}  # task id → the span files its rollouts were built from
        self.stats = {name: dict.fromkeys(STAT_KEYS, 0) for name in self.envs}
        self.foreign: set[str] = set()  # rollouts of no listed environment
        self.released: set[str] = set()  # rollouts already handed on (a group's rebuild may find some early)

    def stage(self, table: pa.Table, files: Sequence[Path] = ()) -> None:
        """Note the rollouts of newly built trajectories (their rows are rebuilt on release, from
        ``files``, the span files they were built from, when given; else from the whole folder)."""
        if table.num_rows == 0:
            return
        pairs = table.select(["task_id", "rollout_id"]).group_by(["task_id", "rollout_id"]).aggregate([])
        now = time.monotonic()
        for task, rollout in zip(pairs["task_id"].to_pylist(), pairs["rollout_id"].to_pylist(), strict=True):
            if rollout in self.released:
                continue
            if task is None or env_of(task) not in self.envs:
                self.foreign.add(rollout)
                continue
            self.arrived.setdefault(task, set()).add(rollout)
            self.first_seen.setdefault(task, now)
            self.files.setdefault(task, set()).update(files)

    def release(self, exclude: set[str]) -> pa.Table:
        """The rows of every group now complete (or waited out), built per environment; rollouts in
        ``exclude`` (trained or dropped) left out."""
        now = time.monotonic()
        ready: dict[str, Any] = {}
        for task, rollouts in self.arrived.items():
            env = self.envs[env_of(task)]
            if len(rollouts) >= env.group_size or now - self.first_seen[task] >= self.timeout_s:
                ready.setdefault(env.name, []).append(task)
        tables = []
        for name, tasks in ready.items():
            files = set().union(*(self.files[task] for task in tasks))
            if not all(self.files[task] for task in tasks):
                files = set()  # some rollouts came without their files: read the whole folder
            skip = frozenset(exclude | self.released)
            part = environment_rows(
                self.spans_dir, self.envs[name], tasks, skip, tuple(sorted(files)) or None
            )
            self.released.update(pc.unique(part.table["rollout_id"]).to_pylist())
            for key, value in part.stats.items():
                self.stats[name][key] += value
            tables.append(part.table)
            for task in tasks:
                self.released |= self.arrived.pop(task)
                del self.first_seen[task], self.files[task]
        return pa.concat_tables(tables) if tables else schemas.trajectories().empty_table()


def rollouts_per_step(environments: Sequence[Environment], groups_per_batch: int) -> int:
    """Rollouts one step trains when each environment gets its weight share of the groups."""
    total = sum(env.weight for env in environments)
    return max(1, round(groups_per_batch * sum(env.weight * env.group_size for env in environments) / total))


def select_by_weight(
    env_of_group: pa.Array, waited: Any, quotas: Sequence[int], timeout_s: float
) -> list[int] | None:
    """Which ready groups (their environment's index, seconds waited) a step trains: each
    environment's quota, oldest first, once every quota can be met; or, once the oldest group has
    waited ``timeout_s``, what is ready (quotas first, then the oldest of the rest), up to the total."""
    import numpy as np

    env_index = np.asarray(env_of_group)
    order = np.argsort(-np.asarray(waited), kind="stable")
    picked: list[int] = []
    short = False
    for env, quota in enumerate(quotas):
        mine = [int(i) for i in order if env_index[i] == env][:quota]
        short |= len(mine) < quota
        picked.extend(mine)
    if short:
        if len(order) == 0 or np.max(waited) < timeout_s:
            return None
        rest = [int(i) for i in order if int(i) not in picked]
        picked.extend(rest[: sum(quotas) - len(picked)])
    return picked or None


def pick_groups(
    keys: pa.Array,
    rows: pa.Table,
    arrived: pa.Array,
    options: Any,
    groups_per_batch: int,
    turns: WeightedTurns | None,
    env_names: Sequence[str],
    ages: np.ndarray | None = None,
    carried: Collection[str] = (),
) -> pa.Array | None:
    """The keys of the groups a step trains now (``rows``: the buffered trajectory rows, ``keys``,
    ``arrived`` and ``ages`` — versions old at this step — per row), or None to keep waiting. A group
    is ready with ``options.group_size`` rollouts, or with two once it has waited
    ``options.group_timeout_s``; a step runs once ``groups_per_batch`` are ready, or what is ready
    once the oldest waited out. It takes the groups nearest the staleness bound first (oldest sampled
    version, then oldest arrival), and a group *due* — as old as ``options.max_staleness``, so stale
    at the next step — trains with the two or more rollouts it has (its stragglers would go stale
    with it otherwise). With environments (``turns``) the stager releases whole groups and they are
    shared out by weight. A group in ``carried`` (trained before without some of its rollouts) is
    ready with one and joins the next step beyond ``groups_per_batch`` (it makes no step alone): its
    late rollouts train against the baseline of those trained before."""
    import numpy as np

    frame = pa.table(
        {
            "key": keys,
            "rollout_id": rows["rollout_id"],
            "task_id": rows["task_id"],
            "arrived": arrived,
            "age": pa.array(np.zeros(rows.num_rows, np.int64) if ages is None else ages, pa.int64()),
        }
    )
    groups = frame.group_by("key").aggregate(
        [("rollout_id", "count_distinct"), ("arrived", "min"), ("task_id", "min"), ("age", "max")]
    )
    waited = time.time() - groups["arrived_min"].to_numpy()
    timeout = options.group_timeout_s
    if turns is not None:
        quotas = turns.quotas(groups_per_batch)
        picked = select_by_weight(
            group_environments(groups["task_id_min"], list(env_names)), waited, list(quotas), timeout
        )
        if picked is None:
            return None
        turns.skip(groups_per_batch)
        return groups["key"].take(pa.array(picked, pa.int64()))
    count = groups["rollout_id_count_distinct"].to_numpy()
    late = np.zeros(len(count), dtype=bool)
    if carried:
        is_late = pc.is_in(groups["key"], value_set=pa.array(sorted(carried), groups["key"].type))
        late = np.asarray(pc.fill_null(is_late, False).to_numpy(zero_copy_only=False), dtype=bool)
    ready = ~late & ((count >= options.group_size) | ((count >= 2) & (waited >= timeout)))
    # late rollouts never make a step alone: a step publishes a version, and one of stragglers only
    # would age every other buffered rollout by a version for a handful of episodes
    if not ready.any() or (ready.sum() < groups_per_batch and waited[ready].max() < timeout):
        return None
    age = groups["age_max"].to_numpy()
    due = np.zeros(len(age), dtype=bool)
    if ages is not None and options.max_staleness is not None and options.staleness_mode != "downweight":
        due = ~late & (count >= 2) & (age >= options.max_staleness)
    candidates = np.flatnonzero(ready | due)
    # nearest the bound first; of equal age the ready (whole) groups, then the longest waiting
    order = np.lexsort((-waited[candidates], ~ready[candidates], -age[candidates]))
    # late rollouts come on top: their groups were counted in the step that trained the rest
    taken = np.concatenate([candidates[order][:groups_per_batch], np.flatnonzero(late)])
    return groups["key"].take(pa.array(taken, pa.int64()))
