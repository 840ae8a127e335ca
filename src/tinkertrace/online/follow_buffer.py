"""Follow mode's buffer: the trajectory rows built and not yet trained or dropped, when each rollout
arrived, and which groups the next step takes (:func:`~tinkertrace.online.group_staging.pick_groups`)."""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable

import pyarrow as pa
import pyarrow.compute as pc

from tinkertrace.online.group_staging import pick_groups
from tinkertrace.online.settings import FollowSettings
from tinkertrace.online.staleness import row_ages
from tinkertrace.training.config import TrainSettings
from tinkertrace.training.dataset import group_keys
from tinkertrace.training.environments import WeightedTurns


class FollowBuffer:
    """Rows waiting for a step (``table``), their rollouts' arrival times, and the rollouts trained or
    dropped (``consumed``, recorded in checkpoints): those never enter the buffer again."""

    def __init__(self, config: TrainSettings, options: FollowSettings, turns: WeightedTurns | None) -> None:
        self.config, self.options, self.turns = config, options, turns
        self.table = pa.table({})
        self.arrived: dict[str, float] = {}
        self.consumed: set[str] = set()

    @property
    def num_rows(self) -> int:
        return self.table.num_rows

    def add(self, table: pa.Table) -> None:
        """Buffer newly built trajectories, less the rows of rollouts already trained or dropped (this
        run or, after a restart, a recorded one): nothing is trained twice."""
        if table.num_rows and self.consumed:
            consumed = pa.array(sorted(self.consumed), pa.string())
            table = table.filter(pc.invert(pc.is_in(table["rollout_id"], value_set=consumed)))
        if table.num_rows == 0:
            return
        self.note_arrival(pc.unique(table["rollout_id"]).to_pylist(), time.time())
        self.table = table if self.table.num_columns == 0 else pa.concat_tables([self.table, table])

    def note_arrival(self, rollout_ids: Iterable[str], at: float) -> None:
        """Record when rollouts arrived (the first time only)."""
        for rid in rollout_ids:
            self.arrived.setdefault(rid, at)

    def remove(self, mask: pa.Array | pa.ChunkedArray) -> pa.Table:
        """Take the rows where ``mask`` is true out of the buffer; those rows."""
        taken = self.table.filter(mask)
        self.table = self.table.filter(pc.invert(mask))
        return taken

    def select(self, step: int, carried: Collection[str] = ()) -> tuple[pa.Table, list[str]] | None:
        """Take the rows of the groups to train at ``step`` out of the buffer (and their rollout ids), or
        None to keep waiting. ``carried``: the groups trained short before (their late rollouts)."""
        if self.table.num_rows == 0:
            return None
        keys = group_keys(self.table, self.config.group_by)
        arrived = pa.array([self.arrived[r] for r in self.table["rollout_id"].to_pylist()], pa.float64())
        names = [env.name for env in self.config.environments]
        bounded = self.options.max_staleness is not None and self.turns is None
        ages = row_ages(self.table, step) if bounded else None  # nearest the bound first
        chosen = pick_groups(
            keys,
            self.table,
            arrived,
            self.options,
            self.config.groups_per_batch,
            self.turns,
            names,
            ages,
            carried=carried,
        )
        if chosen is None:
            return None
        selected = self.remove(pc.is_in(keys, chosen))
        return selected, pc.unique(selected["rollout_id"]).to_pylist()

    def consume(self, ids: Iterable[str]) -> None:
        """Mark rollouts trained or dropped; their arrival times go once none of their rows is left
        in the buffer (grouped by task+agent, a rollout's other agents may still wait for a step)."""
        waiting = set(self.table["rollout_id"].to_pylist()) if self.table.num_rows else set()
        for rid in ids:
            self.consumed.add(rid)
            if rid not in waiting:
                self.arrived.pop(rid, None)
