"""The training data: load trajectories (or build them from spans), clean, group, score, batch.

Rows that cannot be trained are dropped and reported, never silently: a missing or NaN reward,
token/logprob/mask lists of different lengths, an unreadable file. Groups (the GRPO group key:
task id, or task id + agent name) whose trajectories all got the same reward are removed by
default, since their centred advantage is zero.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tinkertrace import schemas
from tinkertrace.training.advantages import compute_advantages, constant_reward_groups
from tinkertrace.training.errors import DataError
from tinkertrace.training.outcomes import dropped_where
from tinkertrace.training.trainability import GroupTally, replies_of, untrainable_message

REQUIRED_COLUMNS = (
    "rollout_id",
    "task_id",
    "agent_name",
    "segment",
    "tokens",
    "logprobs",
    "action_mask",
    "reward",
)
# kept when present: the policy versions that sampled each row (follow mode's staleness reads them), and
# the row's replies and how many the reply cap cut (the cut share)
OPTIONAL_COLUMNS = ("policy_version", "response_policy_versions", "num_turns", "replies_cut")
TRAJECTORIES_FILE = "trajectories.parquet"


@dataclass
class DataReport:
    """What was read and what was left out, with reasons."""

    source: str = ""
    rows_read: int = 0
    files_skipped: list[str] = field(default_factory=list)
    rows_bad_reward: int = 0
    rows_bad_lengths: int = 0
    groups: int = 0
    groups_constant_removed: int = 0
    trajectories: int = 0
    rows: int = 0
    dropped: list[dict[str, Any]] = field(default_factory=list)  # outcome records of the rows left out

    def notes(self) -> list[str]:
        """One line per thing that was dropped."""
        out = [f"skipped unreadable file {f}" for f in self.files_skipped]
        if self.rows_bad_reward:
            out.append(f"dropped {self.rows_bad_reward} trajectory rows with a missing or NaN reward")
        if self.rows_bad_lengths:
            out.append(
                f"dropped {self.rows_bad_lengths} rows whose tokens/logprobs/action_mask lengths differ"
            )
        if self.groups_constant_removed:
            out.append(
                f"removed {self.groups_constant_removed} of {self.groups} groups with a constant reward"
            )
        return out


@dataclass
class TrainingData:
    """Cleaned rows sorted by (group, rollout, agent, segment), with per-row group, trajectory, advantage."""

    table: pa.Table
    group_of_row: np.ndarray
    trajectory_of_row: np.ndarray
    advantage_of_row: np.ndarray
    reward_of_trajectory: np.ndarray
    group_of_trajectory: np.ndarray
    num_groups: int
    fingerprint: str
    report: DataReport

    def rows_for_groups(self, groups: np.ndarray) -> np.ndarray:
        """Row indices (in table order) of the given groups."""
        return np.flatnonzero(np.isin(self.group_of_row, groups))


def _read_parquet_files(files: list[Path], report: DataReport) -> pa.Table:
    tables = []
    for path in files:
        try:
            tables.append(pq.read_table(path))
        except (OSError, pa.ArrowException) as exc:
            report.files_skipped.append(f"{path} ({exc})")
    if not tables:
        raise DataError(f"no readable trajectory files in {report.source}")
    return pa.concat_tables(tables, promote_options="default")


def _is_spans_file(path: Path) -> bool:
    try:
        names = set(pq.read_schema(path).names)
    except (OSError, pa.ArrowException):
        return False
    return "span_id" in names and "tokens" not in names


def is_spans_folder(source: Path) -> bool:
    """Whether ``source`` is a folder of span files (not trajectories)."""
    source = Path(source)
    if not source.is_dir() or (source / TRAJECTORIES_FILE).is_file():
        return False
    files = sorted(p for p in source.rglob("*.parquet") if not p.name.startswith("."))
    return any(_is_spans_file(p) for p in files[:5])


def load_source(source: Path, build_dir: Path) -> tuple[pa.Table, DataReport]:
    """Trajectories from a Parquet file, a folder of trajectory files, or a spans folder (built first)."""
    source = Path(source)
    report = DataReport(source=str(source))
    if not source.exists():
        raise DataError(f"training source {source} does not exist")
    if source.is_file():
        files = [source]
    elif (source / TRAJECTORIES_FILE).is_file():
        files = [source / TRAJECTORIES_FILE]
    else:
        files = sorted(p for p in source.rglob("*.parquet") if not p.name.startswith("."))
        if not files:
            raise DataError(f"no Parquet files under {source}: expected trajectories or spans")
        if any(_is_spans_file(p) for p in files[:5]):
            from tinkertrace.builder import build_trajectories

            result = build_trajectories(source, build_dir)
            report.source = f"{source} (spans, built into {build_dir})"
            table = result.trajectories
            report.rows_read = table.num_rows
            return table, report
    table = _read_parquet_files(files, report)
    report.rows_read = table.num_rows
    return table, report


def group_keys(table: pa.Table, group_by: str) -> pa.ChunkedArray:
    """The GRPO group key of each row: the task id (or the rollout id when it has none), with
    ``group_by="task+agent"`` joined with the agent name."""
    task = pc.coalesce(table["task_id"], table["rollout_id"])
    if group_by == "task":
        return task
    return pc.binary_join_element_wise(task, pc.coalesce(table["agent_name"], pa.scalar("")), "\x1f")


def prepare(
    table: pa.Table,
    *,
    group_by: str = "task",
    advantage: str = "group",
    remove_constant_reward_groups: bool = True,
    report: DataReport | None = None,
) -> TrainingData:
    """Validate, drop unusable rows, group, compute advantages, and fix a deterministic row order."""
    report = report or DataReport(rows_read=table.num_rows)
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise DataError(
            f"{report.source or 'trajectories'} lacks the columns {', '.join(missing)} (not trajectories?)"
        )
    optional = [c for c in OPTIONAL_COLUMNS if c in table.column_names]
    typed = table.select(list(REQUIRED_COLUMNS)).cast(
        pa.schema([schemas.trajectories().field(c) for c in REQUIRED_COLUMNS])
    )
    table = pa.Table.from_arrays(
        [*typed.columns, *(table[c] for c in optional)], names=[*REQUIRED_COLUMNS, *optional]
    )
    if table.num_rows == 0:
        raise DataError(f"{report.source or 'the training source'} holds no trajectories")

    reward = table["reward"].to_numpy(zero_copy_only=False).astype(np.float64)  # nulls become NaN
    bad_reward = ~np.isfinite(reward)
    n_tok = pc.list_value_length(table["tokens"]).to_numpy(zero_copy_only=False)
    same = (n_tok == pc.list_value_length(table["logprobs"]).to_numpy(zero_copy_only=False)) & (
        n_tok == pc.list_value_length(table["action_mask"]).to_numpy(zero_copy_only=False)
    )
    report.rows_bad_reward = int(np.count_nonzero(bad_reward))
    report.rows_bad_lengths = int(np.count_nonzero(~same & ~bad_reward))
    report.dropped += dropped_where(table, bad_reward, "bad_reward")
    report.dropped += dropped_where(table, ~same & ~bad_reward, "bad_lengths")
    table = table.filter(pa.array(~bad_reward & same))
    if table.num_rows == 0:
        raise DataError(
            f"no usable trajectories in {report.source or 'the source'}: " + "; ".join(report.notes())
        )

    table = table.append_column("train_group", group_keys(table, group_by))
    table = table.append_column(
        "trajectory",
        pc.binary_join_element_wise(
            table["rollout_id"], pc.coalesce(table["agent_name"], pa.scalar("")), "\x1f"
        ),
    )
    table = table.sort_by(
        [("train_group", "ascending"), ("trajectory", "ascending"), ("segment", "ascending")]
    )
    index = _Index.of(table)
    report.groups = index.num_groups
    if remove_constant_reward_groups:
        constant = constant_reward_groups(index.group_of_trajectory, index.reward_of_trajectory)
        report.groups_constant_removed = int(np.count_nonzero(constant))
        report.dropped += dropped_where(table, constant[index.group_of_row], "constant_reward")
        if constant.all():
            first = np.unique(index.group_of_trajectory, return_index=True)[1]  # a trajectory per group
            rewards = Counter(index.reward_of_trajectory[first].tolist())
            tally = GroupTally(report.groups, reasons=Counter(constant_reward=report.groups), rewards=rewards)
            tally.replies, tally.replies_cut = (int(pc.sum(c).as_py() or 0) for c in replies_of(table))
            raise DataError(untrainable_message(tally))
        table = table.filter(pa.array(~constant[index.group_of_row]))
        index = _Index.of(table)

    advantage_of_traj = compute_advantages(index.group_of_trajectory, index.reward_of_trajectory, advantage)  # type: ignore[arg-type]
    report.trajectories, report.rows = len(index.reward_of_trajectory), table.num_rows
    digest = hashlib.sha256(group_by.encode())
    for name in ("train_group", "trajectory"):
        digest.update("\n".join(pc.unique(table[name]).to_pylist()).encode())
    return TrainingData(
        table=table,
        group_of_row=index.group_of_row,
        trajectory_of_row=index.trajectory_of_row,
        advantage_of_row=advantage_of_traj[index.trajectory_of_row],
        reward_of_trajectory=index.reward_of_trajectory,
        group_of_trajectory=index.group_of_trajectory,
        num_groups=index.num_groups,
        fingerprint=digest.hexdigest()[:16],
        report=report,
    )


@dataclass
class _Index:
    group_of_row: np.ndarray
    trajectory_of_row: np.ndarray
    reward_of_trajectory: np.ndarray
    group_of_trajectory: np.ndarray
    num_groups: int

    @classmethod
    def of(cls, table: pa.Table) -> _Index:
        group_of_row = _dense_index(table["train_group"])
        trajectory_of_row = _dense_index(table["trajectory"])
        _, first_row = np.unique(trajectory_of_row, return_index=True)
        reward = table["reward"].to_numpy().astype(np.float64)
        return cls(
            group_of_row,
            trajectory_of_row,
            reward[first_row],
            group_of_row[first_row],
            int(group_of_row.max()) + 1,
        )


def _dense_index(column: pa.ChunkedArray) -> np.ndarray:
    """0-based ids in order of first appearance (the column is sorted, so ids follow sort order)."""
    encoded = column.combine_chunks().dictionary_encode()
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)


def epoch_batches(
    num_groups: int, groups_per_batch: int, *, seed: int, epoch: int, shuffle: bool
) -> list[np.ndarray]:
    """The group ids of each batch of ``epoch``: a seeded permutation cut into batches (last may be short)."""
    order = np.random.default_rng([seed, epoch]).permutation(num_groups) if shuffle else np.arange(num_groups)
    return [order[i : i + groups_per_batch] for i in range(0, num_groups, groups_per_batch)]


def steps_per_epoch(num_groups: int, groups_per_batch: int) -> int:
    """Batches in one epoch."""
    return math.ceil(num_groups / groups_per_batch)
