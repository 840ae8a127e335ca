"""Follow mode's account of dropped rollouts: stale ones (older than ``max_staleness`` versions) and
untrainable ones, recorded in ``outcomes.jsonl`` at once, with the next checkpoint, and told to the
endpoint's admission gate between steps."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tinkertrace.online.follow_buffer import FollowBuffer
from tinkertrace.online.follow_result import FollowResult
from tinkertrace.online.publish import Publisher
from tinkertrace.online.settings import FollowSettings
from tinkertrace.online.staleness import rollout_ages, stale_rows
from tinkertrace.training.dataset import group_keys
from tinkertrace.training.outcomes import DROPPED, outcome_rows
from tinkertrace.training.step import TrainingSession


class DropLedger:
    """The rollouts dropped since the last checkpoint and their outcome records."""

    def __init__(self, options: FollowSettings, group_by: str) -> None:
        self.options, self.group_by = options, group_by
        self.since_save: list[str] = []  # dropped, to be recorded with the next checkpoint
        self.reported = 0  # how many of those the endpoint's gate was told of
        self.stale_now: list[str] = []  # dropped as stale by the latest poll
        self.records: list[dict[str, Any]] = []  # outcome records of the drops (outcomes.jsonl)
        self.stale_groups: set[str] = set()  # correct mode: groups dropped whole (later rollouts too)

    def drop_stale(self, buffer: FollowBuffer, step: int) -> list[str]:
        """Remove rollouts older than ``max_staleness`` versions from ``buffer`` (drop mode; in correct
        mode whole groups with nothing left to train); their ids."""
        o = self.options
        if o.max_staleness is None or o.staleness_mode == "downweight" or buffer.num_rows == 0:
            return []
        keys = group_keys(buffer.table, self.group_by)
        over = stale_rows(buffer.table, keys, step, o.max_staleness, o.staleness_mode, self.stale_groups)
        if not over.any():
            return []
        return self.record_stale(buffer.remove(pa.array(over)), step)

    def record_stale(self, rows: pa.Table, step: int) -> list[str]:
        """The outcome records of ``rows`` (whole rollouts) dropped as stale at ``step``; their ids."""
        behind = rollout_ages(rows, step).tolist()
        self.records += outcome_rows(rows, DROPPED, step=step, reason="stale", versions_behind=behind)
        return pc.unique(rows["rollout_id"]).to_pylist()

    def count_stale(self, ids: list[str], result: FollowResult) -> None:
        """Count ``ids`` as dropped stale: the run's figure, this poll's and step's, and the ids the
        next checkpoint and the endpoint's gate are told of."""
        result.rollouts_dropped_stale += len(ids)
        self.since_save.extend(ids)
        self.stale_now.extend(ids)

    def report(self, publish: Publisher | None) -> None:
        """Tell the endpoint's gate of the rollouts dropped since the last report. A step's drops
        otherwise reach it with the step's publication, and a batch of constant-reward groups trains
        no step: a gate full of such rollouts would hold every rollout the next step needs."""
        new = self.since_save[self.reported :]
        if new and publish is not None:
            publish.consume(new)
        self.reported = len(self.since_save)

    def write(self, session: TrainingSession) -> None:
        """Record the rows dropped since the last call in ``outcomes.jsonl`` now: a stale drop after
        the run's last step has no checkpoint to go with, and must not go unrecorded."""
        session.outcomes.write(self.records)
        self.records = []

    def saved(self) -> None:
        """A checkpoint recorded (and a publication told the gate of) the drops since the last one."""
        self.since_save.clear()
        self.reported = 0
