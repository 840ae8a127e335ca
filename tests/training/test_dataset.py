"""Loading, cleaning, grouping and batching of the training data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tinkertrace import schemas
from tinkertrace.training.dataset import epoch_batches, load_source, prepare
from tinkertrace.training.errors import DataError


def test_constant_groups_removed_and_multi_segment_rollout_shares_one_advantage(make_trajectories) -> None:
    trajectories_table = make_trajectories
    data = prepare(trajectories_table(num_tasks=2, per_task=2))
    assert data.report.groups == 3 and data.report.groups_constant_removed == 1
    assert set(data.table["task_id"].to_pylist()) == {"task0", "task1"}
    # task0: r0-0 (1), r0-1 (0), r0-seg (1, two segments) -> mean 2/3
    rows = {
        (rid, seg): adv
        for rid, seg, adv in zip(
            data.table["rollout_id"].to_pylist(),
            data.table["segment"].to_pylist(),
            data.advantage_of_row,
            strict=True,
        )
    }
    assert rows[("r0-seg", 0)] == pytest.approx(1 / 3) and rows[("r0-seg", 1)] == pytest.approx(1 / 3)
    assert rows[("r0-1", 0)] == pytest.approx(-2 / 3)
    assert rows[("r1-0", 0)] == pytest.approx(0.5)
    assert data.report.trajectories == 5


def test_keep_constant_groups_and_group_by_task_and_agent(make_trajectories) -> None:
    trajectories_table = make_trajectories
    table = trajectories_table(num_tasks=1, per_task=2)
    data = prepare(table, remove_constant_reward_groups=False, group_by="task+agent")
    assert data.num_groups == 2 and data.report.groups_constant_removed == 0
    const_rows = np.asarray(data.table["task_id"].to_pylist()) == "const"
    assert np.all(data.advantage_of_row[const_rows] == 0)


def test_nan_and_missing_rewards_and_bad_lengths_are_dropped_and_reported(make_trajectories) -> None:
    trajectories_table = make_trajectories
    table = trajectories_table(num_tasks=1, per_task=4).to_pylist()
    table[0]["reward"] = float("nan")
    table[1]["reward"] = None
    table[2]["logprobs"] = table[2]["logprobs"][:-1]
    data = prepare(
        pa.Table.from_pylist(table, schema=schemas.trajectories()), remove_constant_reward_groups=False
    )
    assert (data.report.rows_bad_reward, data.report.rows_bad_lengths) == (2, 1)
    notes = " ".join(data.report.notes())
    assert "2 trajectory rows with a missing or NaN reward" in notes and "lengths differ" in notes


def test_unusable_inputs_raise_clear_errors(tmp_path: Path, make_trajectories) -> None:
    trajectories_table = make_trajectories
    with pytest.raises(DataError, match="holds no trajectories"):
        prepare(schemas.trajectories().empty_table())
    with pytest.raises(DataError, match="lacks the columns"):
        prepare(pa.table({"rollout_id": ["a"]}))
    only_const = pa.Table.from_pylist(trajectories_table().to_pylist()[-3:], schema=schemas.trajectories())
    with pytest.raises(DataError, match="keep-constant-reward-groups"):
        prepare(only_const)
    with pytest.raises(DataError, match="does not exist"):
        load_source(tmp_path / "missing", tmp_path / "build")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no Parquet files"):
        load_source(tmp_path / "empty", tmp_path / "build")


def test_sources_file_folder_and_corrupt_file_skipped(
    tmp_path: Path, trajectories_file: Path, make_trajectories
) -> None:
    trajectories_table, path = make_trajectories, trajectories_file
    for source in (path, path.parent):
        table, report = load_source(source, tmp_path / "build")
        assert table.num_rows == report.rows_read == trajectories_table().num_rows
    folder = tmp_path / "many"
    pq.write_table(trajectories_table(), folder.mkdir() or folder / "a.parquet")
    (folder / "b.parquet").write_bytes(b"PAR1 not really")
    table, report = load_source(folder, tmp_path / "build")
    assert table.num_rows == trajectories_table().num_rows
    assert len(report.files_skipped) == 1 and "b.parquet" in report.notes()[0]


def test_epoch_batches_are_seeded_permutations() -> None:
    a = epoch_batches(7, 3, seed=1, epoch=0, shuffle=True)
    assert [len(b) for b in a] == [3, 3, 1]
    assert sorted(np.concatenate(a).tolist()) == list(range(7))
    assert all(
        np.array_equal(x, y)
        for x, y in zip(a, epoch_batches(7, 3, seed=1, epoch=0, shuffle=True), strict=True)
    )
    assert not all(
        np.array_equal(x, y)
        for x, y in zip(a, epoch_batches(7, 3, seed=1, epoch=1, shuffle=True), strict=True)
    )
    assert np.concatenate(epoch_batches(5, 2, seed=0, epoch=0, shuffle=False)).tolist() == [0, 1, 2, 3, 4]
