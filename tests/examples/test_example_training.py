"""Each example's training command, shortened, on the built-in model: trajectories and a training step."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tinkertrace.evaluation import load_ref

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SHORT = {"epochs": 1, "groups_per_batch": 2, "lora_rank": 2, "remove_constant_reward_groups": False}


def _train(name: str, out: Path, resume: bool = False, **train: object) -> dict:
    run = load_ref(f"{EXAMPLES / 'train.py'}:train")
    return run(
        EXAMPLES / name / "config.yaml",
        out,
        resume=resume,
        overrides={"tasks_per_env": 1, "concurrency": 4, "train": {**SHORT, **train}},
        progress=False,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "agents", "min_turns"),
    [
        ("hello", {None}, 1),
        ("guess_number", {None}, 1),
        ("twenty_questions", {"player"}, 1),
        ("solver_judge", {"solver", "judge"}, 1),
    ],
)
def test_example_trains(name: str, agents: set, min_turns: int, tmp_path: Path) -> None:
    summary = _train(name, tmp_path)
    traj = pq.read_table(tmp_path / "trajectories.parquet")
    assert traj.num_rows >= 2
    assert set(traj["agent_name"].to_pylist()) == agents
    assert min(traj["num_turns"].to_pylist()) >= min_turns
    rewards = traj["reward"].to_pylist()
    assert all(r is not None and 0.0 <= r <= 1.0 for r in rewards)
    assert summary["train"]["steps"] >= 1
    assert (tmp_path / "train" / "checkpoints.jsonl").exists()


@pytest.mark.slow
def test_multi_env_reward_settings_checkpoints_and_resume(tmp_path: Path) -> None:
    first = _train("multi_env", tmp_path)
    envs = first["rollouts"]["envs"]
    assert set(envs) == {"arithmetic", "spelling"}
    assert envs["arithmetic"]["rollouts"] == 4 and envs["spelling"]["rollouts"] == 3
    traj = pq.read_table(tmp_path / "trajectories.parquet")
    assert set(traj["task_id"].to_pylist()) <= {t for t in traj["task_id"].to_pylist()}
    arith = [
        r
        for r, t in zip(traj["reward"].to_pylist(), traj["task_id"].to_pylist(), strict=True)
        if "arith" in t
    ]
    assert arith and all(r is not None for r in arith)
    done = first["train"]["steps"]
    assert done >= 1
    with pytest.raises(FileExistsError):
        _train("multi_env", tmp_path)
    again = _train("multi_env", tmp_path, resume=True, epochs=2)
    assert again["train"]["start_step"] == done and again["train"]["total_steps"] == 2 * done
