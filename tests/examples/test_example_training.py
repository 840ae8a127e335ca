"""Each example's one command, `tinkertrace train --follow --config examples/NAME/config.yaml`,
shortened, on the nano built-in model: the command starts the collector, the endpoint and agent worker
processes, trains at least one step, publishes it to the endpoint, and the rollouts it trained have
the example's shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tinkertrace.training.checkpoints import read_checkpoints
from tinkertrace.training.config import make_config
from tinkertrace.training.environments import environment_rows
from tinkertrace.training.metrics import read_metrics

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SHORT = (
    "--model", "tinkertrace/tiny-chat:nano", "--lora-rank", "2", "--max-steps", "1", "--workers", "1",
    "--groups-per-batch", "1", "--group-timeout", "20", "--max-seconds", "240",
    "--keep-constant-reward-groups", "--no-progress",
)  # fmt: skip


def train_example(config: Path, log_dir: Path, *extra: str) -> dict:
    """Run the example's command; its summary (LOG_DIR/summary.json)."""
    command = [sys.executable, "-m", "tinkertrace.cli.main", "train", "--follow", "--config", str(config)]
    done = subprocess.run(
        [*command, "--log-dir", str(log_dir), *SHORT, *extra], capture_output=True, text=True, timeout=420
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((log_dir / "summary.json").read_text())


def _check_trained(summary: dict, log_dir: Path, start: int = 0) -> set[str]:
    """The run trained step ``start + 1`` and the endpoint served it; the rollouts that step trained."""
    assert summary["start_step"] == start and summary["steps"] == start + 1, summary
    assert summary["served_version"] == start + 1  # the endpoint serves the newly trained version
    record = read_checkpoints(log_dir)[-1]
    assert record["mode"] == "follow" and record["trained_rollout_ids"]
    return set(record["trained_rollout_ids"])


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
    config = EXAMPLES / name / "config.yaml"
    summary = train_example(config, tmp_path)
    trained = _check_trained(summary, tmp_path)
    (env,) = make_config(config).environments
    rows = environment_rows(tmp_path / "spans", env).table
    rows = rows.filter(pc.is_in(rows["rollout_id"], value_set=pa.array(sorted(trained))))
    assert rows.num_rows >= 2
    assert set(rows["agent_name"].to_pylist()) == agents
    turns = rows["num_turns"].to_pylist()
    assert min(turns) >= 1 and max(turns) <= max_turns
    assert all(r is not None and 0.0 <= r <= 1.0 for r in rows["reward"].to_pylist())
    assert (
        summary["environments"][env.name]["rollouts"] >= 2
        and summary["environments"][env.name]["failed"] == 0
    )
    assert summary["agent_errors"] == []


@pytest.mark.slow
def test_multi_env_trains_both_environments_and_resumes(tmp_path: Path) -> None:
    config = EXAMPLES / "multi_env" / "config.yaml"
    first = train_example(config, tmp_path, "--groups-per-batch", "2", "--workers", "2")
    trained = _check_trained(first, tmp_path)
    assert set(first["environments"]) == {"arithmetic", "spelling"}
    (metrics,) = read_metrics(tmp_path)
    # weights 1:1, two groups a step: one group of each environment
    assert metrics["env/arithmetic/total_episodes"] > 0 and metrics["env/spelling/total_episodes"] > 0
    logged = [
        json.loads(line) for f in (tmp_path / "agents").glob("*.jsonl") for line in f.read_text().splitlines()
    ]
    assert {row["env"] for row in logged} == {"arithmetic", "spelling"}  # workers ran both environments
    again = train_example(config, tmp_path, "--groups-per-batch", "2", "--workers", "2", "--max-steps", "2")
    assert not trained & _check_trained(again, tmp_path, start=1)  # resumed; nothing trained twice
