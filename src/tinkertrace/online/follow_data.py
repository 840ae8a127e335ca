"""The data of one follow step: the selected rows as training data, with their late rollouts' baseline,
constant-reward groups dropped and counted, stale rows downweighted (or, in correct mode, rollouts
wholly over the bound dropped after lending their reward to the baseline)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tinkertrace.online.drop_ledger import DropLedger
from tinkertrace.online.follow_result import FollowResult
from tinkertrace.online.late_rollouts import LateRollouts
from tinkertrace.online.settings import FollowSettings
from tinkertrace.online.staleness import rollout_ages, row_ages
from tinkertrace.training.config import TrainSettings
from tinkertrace.training.dataset import DataReport, TrainingData, group_keys
from tinkertrace.training.errors import DataError
from tinkertrace.training.step import prepare_data
from tinkertrace.training.trainability import TrainabilityWatch, tally_groups

PreparedStep = tuple[TrainingData, np.ndarray, set[str], np.ndarray]
"""Training data, the rows to train, the rollouts kept, and each trained row's age in versions."""


class StepData:
    """Turns a step's selected rows into :data:`PreparedStep`, recording what it drops in ``drops`` and
    telling ``watch`` which of its groups could be trained."""

    def __init__(
        self,
        config: TrainSettings,
        options: FollowSettings,
        late: LateRollouts,
        drops: DropLedger,
        watch: TrainabilityWatch,
    ) -> None:
        self.config, self.options, self.late, self.drops = config, options, late, drops
        self.watch = watch

    def prepare(self, table: pa.Table, step: int, result: FollowResult) -> PreparedStep | None:
        """``table`` as training data (constant-reward groups dropped and counted, stale rows
        downweighted), the rows to train (the rows of ``table``: a late rollout's group's earlier
        rows join the data only for its baseline), the rollouts kept, and each row's age in versions;
        None if nothing is left."""
        o = self.options
        ids = set(pc.unique(table["rollout_id"]).to_pylist())
        baseline = self.late.baseline_of(table)
        report = DataReport()
        try:
            whole = pa.concat_tables([table, baseline], promote_options="default") if baseline else table
            data: TrainingData | None = prepare_data(whole, self.config, report)
        except DataError:  # every group had a constant reward
            data = None
        self.drops.records += [{**r, "step": step} for r in report.dropped if r["rollout_id"] in ids]
        rows, kept, spent = np.zeros(0, dtype=np.int64), set[str](), list[str]()
        if data is not None:
            own = pc.is_in(data.table["rollout_id"], pa.array(sorted(ids), pa.string()))
            rows = np.flatnonzero(own.to_numpy(zero_copy_only=False))
            if o.staleness_mode == "correct" and o.max_staleness is not None:
                rows, spent = self._without_spent(data.table, rows, step, o.max_staleness, result)
            kept = set(pc.unique(data.table["rollout_id"].take(rows)).to_pylist())
        constant = ids - kept - set(spent)
        self._observe(table, kept, spent)
        result.rollouts_dropped_constant += len(constant)
        self.drops.since_save.extend(sorted(constant))
        if data is None or not kept:
            return None
        age = row_ages(data.table, step)
        if o.max_staleness is not None and o.staleness_mode == "downweight":
            over = np.clip(age - o.max_staleness, 0, None)
            data.advantage_of_row = data.advantage_of_row * o.staleness_decay**over
        return data, rows, kept, age[rows]

    def _observe(self, table: pa.Table, kept: set[str], spent: list[str]) -> None:
        """Tell the watch the verdict on each group of ``table``; rollouts dropped as stale are left
        out (staleness is counted on its own)."""
        if spent:
            table = table.filter(pc.invert(pc.is_in(table["rollout_id"], pa.array(spent, pa.string()))))
        if table.num_rows:
            self.watch.observe(tally_groups(table, group_keys(table, self.config.group_by), kept))

    def _without_spent(
        self, table: pa.Table, rows: np.ndarray, step: int, bound: int, result: FollowResult
    ) -> tuple[np.ndarray, list[str]]:
        """Correct mode: ``rows`` without the rollouts wholly over ``bound`` (their newest token too),
        and those rollouts. Their rewards are already in their group's advantages (its baseline); they
        train nothing, so they are dropped as stale, not sent to the trainer."""
        spent = rollout_ages(table, step, newest=True)[rows] > bound
        if not spent.any():
            return rows, []
        ids = self.drops.record_stale(table.take(rows[spent]), step)
        self.drops.count_stale(ids, result)
        return rows[~spent], ids
