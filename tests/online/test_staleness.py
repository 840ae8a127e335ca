"""Per-token policy versions (one helper, with or without the builder's per-token column), row ages,
the staleness bound by rollout or by whole group, and the staleness histograms."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tinkertrace.online.staleness import (
    VERSIONS_COLUMN,
    rollout_ages,
    row_ages,
    stale_rows,
    staleness_metrics,
    token_policy_versions,
)


def rows(versions: list[int | None], masks: list[list[int]], rollouts: list[str] | None = None) -> pa.Table:
    n = len(versions)
    return pa.table(
        {
            "rollout_id": rollouts or [f"r{i}" for i in range(n)],
            "action_mask": pa.array(masks, pa.list_(pa.int8())),
            "policy_version": pa.array(versions, pa.int64()),
        }
    )


def test_versions_repeat_the_row_version_without_the_per_token_column() -> None:
    table = rows([3, None, 5], [[0, 1, 1], [0, 1], [0, 0, 1, 0, 1, 1]])
    assert token_policy_versions(table).to_pylist() == [[3, 3], [None], [5, 5, 5]]


def test_versions_come_from_the_per_token_column_where_it_fits() -> None:
    table = rows([3, 4, 5], [[0, 1, 1], [0, 1], [0, 1, 1]])
    per_token = pa.array([[3, 4], None, [5]], pa.list_(pa.int64()))  # row 2: wrong length, row 1: absent
    table = table.append_column(VERSIONS_COLUMN, per_token)
    assert token_policy_versions(table).to_pylist() == [[3, 4], [4], [5, 5]]
    # a row is as old as its oldest token; unknown versions count as current
    assert row_ages(table, 6).tolist() == [3, 2, 1]
    assert row_ages(rows([None], [[0, 1]]), 6).tolist() == [0]


def test_drop_splits_a_group_but_correct_drops_it_whole_and_remembers_it() -> None:
    table = rows([1, 3, 3, 3], [[0, 1]] * 4, ["a1", "a2", "b1", "b2"])
    keys = pa.array(["a", "a", "b", "b"])
    assert stale_rows(table, keys, 3, 1, "drop", set()).tolist() == [True, False, False, False]
    dropped: set[str] = set()
    assert stale_rows(table, keys, 3, 1, "correct", dropped).tolist() == [True, True, False, False]
    assert dropped == {"a"}
    late = rows([3], [[0, 1]], ["a3"])  # a fresh rollout of the dropped group arrives later
    assert stale_rows(late, pa.array(["a"]), 3, 1, "correct", dropped).tolist() == [True]


def test_histograms_count_tokens_and_rollouts_by_age() -> None:
    table = rows([5, 4, 4, 0], [[0, 1, 1], [0, 1], [1, 1, 1], [0, 1]], ["x", "y", "y", "z"])
    per_token = pa.array([[5, 5], [4], [4, 5, 5], [0]], pa.list_(pa.int64()))
    metrics = staleness_metrics(table.append_column(VERSIONS_COLUMN, per_token), 5)
    tokens = [metrics[f"offpolicy/token_age_{a}"] for a in ("0", "1", "2", "3", "4+")]
    rollouts = [metrics[f"offpolicy/rollout_age_{a}"] for a in ("0", "1", "2", "3", "4+")]
    assert tokens == [4, 2, 0, 0, 1]
    assert rollouts == [1, 1, 0, 0, 1]  # y's oldest token is 1 version old
    assert metrics["offpolicy/multi_version_rollouts"] == 1  # y: versions 4 and 5
    assert metrics["offpolicy/token_age_mean"] == np.mean([0, 0, 1, 1, 0, 0, 5])


def test_a_rollout_of_several_segments_goes_stale_whole() -> None:
    """A long episode built as two segments (rows): its first turns by version 1, its last by 3. At
    step 3 with bound 1 the rollout is two versions old in both rows — before, only the first row was
    dropped and the second trained or dropped a step later, the rollout counted stale twice."""
    table = rows([1, 3, 3], [[0, 1]] * 3, ["long", "long", "short"])
    assert rollout_ages(table, 3).tolist() == [2, 2, 0]
    assert row_ages(table, 3).tolist() == [2, 0, 0]
    assert stale_rows(table, pa.array(["g", "g", "g"]), 3, 1, "drop", set()).tolist() == [True, True, False]
