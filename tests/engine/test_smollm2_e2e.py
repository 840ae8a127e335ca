"""SmolLM2-135M-Instruct through the whole loop: the guess_number example's SmolLM2 config through
`tinkertrace train --follow` (collector subprocess, the endpoint sampling SmolLM2 with continuous batching,
an agent worker process, follow training with LoRA) trains a step, publishes it to the endpoint, then the
same command run again resumes from its checkpoint and trains one more without training a rollout twice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tinkertrace.models.tokenizer import load_tokenizer
from tinkertrace.training.config import make_config
from tinkertrace.training.environments import environment_rows

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "guess_number" / "smollm2.yaml"
NAME = "smollm2-135m-instruct"


def _train(out: Path, steps: int) -> dict:
    command = [
        sys.executable, "-m", "tinkertrace.cli.main", "train", "--follow", "--config", str(CONFIG),
        "--log-dir", str(out), "--lora-rank", "4", "--learning-rate", "1e-4", "--max-steps", str(steps),
        "--workers", "1", "--groups-per-batch", "1", "--group-timeout", "240", "--max-seconds", "400",
        "--keep-constant-reward-groups", "--no-progress",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "summary.json").read_text())


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "checkpoints.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.timeout(1300)
def test_guess_number_trains_publishes_and_resumes_on_smollm2(tmp_path: Path) -> None:
    first = _train(tmp_path, steps=1)
    assert (first["steps"], first["served_version"]) == (1, 1), first
    assert first["agent_errors"] == []
    (env,) = make_config(CONFIG).environments
    traj = environment_rows(tmp_path / "spans", env).table.select(["tokens", "num_turns"]).to_pylist()
    tok = load_tokenizer(NAME)
    assert len(traj) >= 2 and all(1 <= t["num_turns"] <= 4 for t in traj)
    # the trained tokens are SmolLM2's: its ChatML template (with its default system prompt) in its BPE
    text = tok.decode(traj[0]["tokens"])
    assert text.startswith("<|im_start|>system\nWe play a game.") and "<|im_start|>assistant\n" in text
    assert max(max(t["tokens"]) for t in traj) > 255  # real BPE ids, not bytes
    trained = set(_records(tmp_path)[-1]["trained_rollout_ids"])

    again = _train(tmp_path, steps=2)  # the same command again: it resumes
    assert (again["start_step"], again["steps"], again["served_version"]) == (1, 2, 2), again
    records = _records(tmp_path)
    assert not trained & set(records[-1]["trained_rollout_ids"])  # nothing trained twice
