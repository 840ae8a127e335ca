"""Each example's one command, shortened, on the nano built-in model: the online loop (collector
subprocess, endpoint, agent worker processes, follow trainer) trains at least one step, publishes it
to the endpoint, and the trajectories it trained on have the example's shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tinkertrace.rollouts import load_ref

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SHORT: dict[str, Any] = {
    "model": "tinkertrace/tiny-chat:nano",
    "steps": 1,
    "workers": 1,
    "groups_per_step": 1,
    "group_timeout_s": 20,
    "max_seconds": 100,
    "train": {"lora_rank": 2, "remove_constant_reward_groups": False},
}


def _train(name: str, out: Path, resume: bool = False, **overrides: Any) -> dict:
    run = load_ref(f"{EXAMPLES / 'train.py'}:train")
    return run(
        EXAMPLES / name / "config.yaml", out, resume=resume, overrides={**SHORT, **overrides}, progress=False
    )


def _check_trained(summary: dict, out: Path, start: int = 0) -> None:
    assert summary["train"]["start_step"] == start
    assert summary["train"]["steps"] == start + 1, summary
    assert summary["served_version"] == start + 1  # the endpoint serves the newly trained version
    records = [json.loads(line) for line in (out / "train" / "checkpoints.jsonl").read_text().splitlines()]
    assert records[-1]["mode"] == "follow" and records[-1]["trained_rollout_ids"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "agents", "max_turns"),
    [
        ("hello", {None}, 1),
        ("guess_number", {None}, 4),
        ("twenty_questions", {"player"}, 8),
        ("solver_judge", {"solver", "judge"}, 1),
    ],
)
def test_example_trains_online(name: str, agents: set, max_turns: int, tmp_path: Path) -> None:
    summary = _train(name, tmp_path)
    _check_trained(summary, tmp_path)
    traj = pq.read_table(tmp_path / "trajectories.parquet")
    assert traj.num_rows >= 2
    assert set(traj["agent_name"].to_pylist()) == agents
    turns = traj["num_turns"].to_pylist()
    assert min(turns) >= 1 and max(turns) <= max_turns
    assert all(r is not None and 0.0 <= r <= 1.0 for r in traj["reward"].to_pylist())
    (env,) = summary["envs"].values()
    assert env["rollouts"] >= 2 and env["failed"] == 0
    assert summary["agent_errors"] == []


@pytest.mark.slow
def test_multi_env_runs_both_environments_and_resumes(tmp_path: Path) -> None:
    first = _train("multi_env", tmp_path, workers=2, groups_per_step=2)
    _check_trained(first, tmp_path)
    envs = first["envs"]
    assert set(envs) == {"arithmetic", "spelling"}
    traj = pq.read_table(tmp_path / "trajectories.parquet")
    prefixes = {t.split("/")[0] for t in traj["task_id"].to_pylist()}
    assert prefixes and prefixes <= {"arithmetic", "spelling"}
    logged = [
        json.loads(line) for f in (tmp_path / "agents").glob("*.jsonl") for line in f.read_text().splitlines()
    ]
    assert {row["env"] for row in logged} == {"arithmetic", "spelling"}  # workers ran both environments
    trained = set(json.loads((tmp_path / "train" / "checkpoints.jsonl").read_text())["trained_rollout_ids"])
    with pytest.raises(FileExistsError):
        _train("multi_env", tmp_path)
    again = _train("multi_env", tmp_path, resume=True, steps=2, workers=2, groups_per_step=2)
    _check_trained(again, tmp_path, start=1)
    records = [
        json.loads(line) for line in (tmp_path / "train" / "checkpoints.jsonl").read_text().splitlines()
    ]
    assert not trained & set(records[-1]["trained_rollout_ids"])  # nothing trained twice
