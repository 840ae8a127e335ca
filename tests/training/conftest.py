"""Fixtures for the training tests: small trajectories tables in ``schemas.trajectories()``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tinkertrace import schemas
from tinkertrace.training import step
from tinkertrace.training.checkpoints import read_checkpoints
from tinkertrace.training.metrics import read_metrics


def _row(rollout: str, task: str, prompt: bytes, response: bytes, reward: float, segment: int = 0) -> dict:
    tokens = list(prompt) + list(response)
    mask = [0] * len(prompt) + [1] * len(response)
    logprobs = [0.0] * len(prompt) + [-5.5] * len(response)  # about uniform over ~260 ids
    return {
        "rollout_id": rollout,
        "task_id": task,
        "agent_name": "solver",
        "group_key": task,
        "segment": segment,
        "split_reason": None if segment == 0 else "template_change",
        "tokens": tokens,
        "logprobs": logprobs,
        "action_mask": mask,
        "reward": reward,
        "num_turns": 1,
        "policy_version": 0,
        "split": "train",
        "end_time": None,
    }


def trajectories_table(num_tasks: int = 4, per_task: int = 4) -> pa.Table:
    """``num_tasks`` tasks x ``per_task`` rollouts; answer "yes" earns 1, "no" earns 0 (mixed groups),
    plus one two-segment rollout and one constant-reward task."""
    rows = []
    for t in range(num_tasks):
        for k in range(per_task):
            good = k % 2 == 0
            rows.append(
                _row(f"r{t}-{k}", f"task{t}", f"Q{t}? ".encode(), b"yes" if good else b"no", float(good))
            )
    rows.append(_row("r0-seg", "task0", b"Q0? ", b"yes", 1.0, segment=0))
    rows.append(_row("r0-seg", "task0", b"again: ", b"yes!", 1.0, segment=1))
    rows.extend(_row(f"rc-{k}", "const", b"C? ", b"ok", 0.5) for k in range(3))
    return pa.Table.from_pylist(rows, schema=schemas.trajectories())


def write_trajectories(path: Path, table: pa.Table | None = None) -> Path:
    """Write ``table`` (default :func:`trajectories_table`) to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table if table is not None else trajectories_table(), path)
    return path


@pytest.fixture
def make_trajectories() -> Callable[..., pa.Table]:
    """The table factory :func:`trajectories_table`."""
    return trajectories_table


@pytest.fixture
def trajectories_file(tmp_path: Path) -> Path:
    """The default table written to ``<tmp>/out/trajectories.parquet``."""
    return write_trajectories(tmp_path / "out" / "trajectories.parquet")


@pytest.fixture
def interrupted_at_step(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], AbstractContextManager[None]]:
    """``with interrupted_at_step(n): run_training(...)``: the run's ``n``-th ``train_step`` raises
    KeyboardInterrupt (as Ctrl-C would) and the block expects it; the real step is restored after."""
    return lambda call: _interrupted_at_step(monkeypatch, call)


@pytest.fixture
def same_run() -> Callable[[Path, Path], None]:
    """``same_run(expected_dir, got_dir)`` asserts the two runs logged the same results."""
    return assert_same_run


@contextmanager
def _interrupted_at_step(monkeypatch: pytest.MonkeyPatch, call: int) -> Iterator[None]:
    real_step, calls = step.train_step, []

    def interrupted(*args: object, **kwargs: object) -> dict[str, float]:
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt
        return real_step(*args, **kwargs)

    monkeypatch.setattr(step, "train_step", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            yield
    finally:
        monkeypatch.setattr(step, "train_step", real_step)


def assert_same_run(expected_dir: Path, got_dir: Path) -> None:
    """Two log folders hold the same steps, per-step losses/KL/rewards and trained rollouts."""
    expected, got = read_metrics(expected_dir), read_metrics(got_dir)
    assert [r["step"] for r in got] == [r["step"] for r in expected]  # repeated steps rewritten, once
    for a, b in zip(expected, got, strict=True):
        for name in ("loss:sum", "optim/kl_sample_train_v1", "env/all/reward/total"):
            assert b[name] == pytest.approx(a[name], rel=1e-5, abs=1e-6), (a["step"], name)
    assert [c["trained_rollout_ids"] for c in read_checkpoints(got_dir)] == [
        c["trained_rollout_ids"] for c in read_checkpoints(expected_dir)
    ]
