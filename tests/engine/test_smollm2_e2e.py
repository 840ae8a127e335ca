"""SmolLM2-135M-Instruct through the whole loop: the guess_number agent's online run (collector
subprocess, the endpoint sampling SmolLM2 with continuous batching, an agent worker process, follow
training with LoRA) trains a step, publishes it to the endpoint, then resumes from its checkpoint and
trains one more without training a rollout twice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tinkertrace.rollouts import load_ref
from tinkertrace.tokenizer import load_tokenizer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAME = "smollm2-135m-instruct"
SHORT: dict[str, Any] = {
    "model": NAME,
    "steps": 1,
    "workers": 1,
    "groups_per_step": 1,
    "group_timeout_s": 240,
    "max_seconds": 400,
    "train": {"lora_rank": 4, "learning_rate": 1e-4, "remove_constant_reward_groups": False},
}


def _train(out: Path, resume: bool = False, **overrides: Any) -> dict:
    run = load_ref(f"{EXAMPLES / 'train.py'}:train")
    config = EXAMPLES / "guess_number" / "config.yaml"
    return run(config, out, resume=resume, overrides={**SHORT, **overrides}, progress=False)


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "train" / "checkpoints.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_guess_number_trains_publishes_and_resumes_on_smollm2(tmp_path: Path) -> None:
    first = _train(tmp_path)
    assert (first["train"]["steps"], first["served_version"]) == (1, 1), first
    assert first["agent_errors"] == []
    traj = pq.read_table(tmp_path / "trajectories.parquet", columns=["tokens", "num_turns"]).to_pylist()
    tok = load_tokenizer(NAME)
    assert len(traj) >= 2 and all(1 <= t["num_turns"] <= 4 for t in traj)
    # the trained tokens are SmolLM2's: its ChatML template (with its default system prompt) in its BPE
    text = tok.decode(traj[0]["tokens"])
    assert text.startswith("<|im_start|>system\nWe play a game.") and "<|im_start|>assistant\n" in text
    assert max(max(t["tokens"]) for t in traj) > 255  # real BPE ids, not bytes
    trained = set(_records(tmp_path)[-1]["trained_rollout_ids"])

    again = _train(tmp_path, resume=True, steps=2)
    assert (again["train"]["start_step"], again["train"]["steps"], again["served_version"]) == (1, 2, 2)
    records = _records(tmp_path)
    assert not trained & set(records[-1]["trained_rollout_ids"])  # nothing trained twice
