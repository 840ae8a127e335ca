"""Late rollouts: a group trained short of ``group_size`` (after ``group_timeout_s``) keeps its rows'
keys and rewards; a straggler of it arriving later joins the next step beyond ``groups_per_batch``,
its advantage taken against the whole group's mean reward."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from tinkertrace.online.staleness import VERSIONS_COLUMN
from tinkertrace.training.dataset import group_keys

CARRIED_GROUPS = 1024
"""Groups trained short of ``group_size`` whose rows are kept as their late rollouts' baseline, at most
(the oldest are forgotten first)."""


def reward_only(rows: pa.Table) -> pa.Table:
    """``rows`` with their token lists emptied: all a baseline needs (keys and rewards), and small."""
    for name in ("tokens", "logprobs", "action_mask", VERSIONS_COLUMN):
        if name in rows.column_names:
            field = rows.schema.field(name)
            rows = rows.set_column(
                rows.column_names.index(name), field, pa.array([[]] * rows.num_rows, field.type)
            )
    return rows


class LateRollouts:
    """The groups trained short of ``group_size``, each with its rows (keys and rewards only)."""

    def __init__(self, group_by: str, group_size: int, enabled: bool = True) -> None:
        self.group_by, self.group_size, self.enabled = group_by, group_size, enabled
        self.carried: dict[str, pa.Table] = {}  # group trained short of its size → its rows (a baseline)

    def late_in(self, table: pa.Table) -> int:
        """Rollouts of ``table`` whose group was trained before without them."""
        keys = group_keys(table, self.group_by)
        late = pc.fill_null(pc.is_in(keys, pa.array(sorted(self.carried), keys.type)), False)
        return len(pc.unique(table["rollout_id"].filter(late)))

    def baseline_of(self, table: pa.Table) -> pa.Table | None:
        """The earlier rows of ``table``'s carried groups, or None."""
        keys = pc.unique(group_keys(table, self.group_by)).to_pylist()
        earlier = [self.carried[k] for k in keys if k in self.carried]
        return pa.concat_tables(earlier, promote_options="default") if earlier else None

    def carry(self, table: pa.Table) -> None:
        """After a step on ``table``: keep the rows of each group still short of ``group_size`` (its
        late rollouts' baseline), forget the groups now whole. Not when disabled (environments: their
        stager releases whole groups)."""
        if not self.enabled:
            return
        keys = group_keys(table, self.group_by)
        for key in pc.unique(keys).drop_null().to_pylist():
            rows = table.filter(pc.fill_null(pc.equal(keys, key), False))
            earlier = self.carried.pop(key, None)
            if earlier is not None:
                rows = pa.concat_tables([earlier, rows], promote_options="default")
            if len(pc.unique(rows["rollout_id"])) < self.group_size:
                self.carried[key] = reward_only(rows)
        while len(self.carried) > CARRIED_GROUPS:
            self.carried.pop(next(iter(self.carried)))
