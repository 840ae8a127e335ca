"""Issue 5's acceptance run, all real: traced rollouts (SDK + OpenAI client + ``tinkertrace.serving``
on the local engine) → spans → build → ``run_training`` → the trained weights served again score a
higher reward on the same tasks → an interrupted run resumed gives the uninterrupted results.

The task is the demo's identity question with its partial-credit reward; sampling is seeded, so the
figures are reproducible (measured: mean reward 0.025 before, 0.125 after, on the nano model).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from openai import OpenAI

import tinkertrace
from tinkertrace.engine import ServiceClient
from tinkertrace.online.demo_agent import QUESTIONS, identity_reward, introduce
from tinkertrace.online.runner import serve_policy
from tinkertrace.training.config import TrainSettings, make_config
from tinkertrace.training.loop import run_training

pytestmark = pytest.mark.slow

MODEL = "tinkertrace/tiny-chat:nano"
MAX_TOKENS = 18  # the target answer is 17 characters
GROUP_SIZE = 16  # rollouts per question (one GRPO group each)
EVAL_SAMPLES = 32  # per question, in one seeded request (n=32)


@pytest.fixture
def endpoint(tmp_path: Path) -> Iterator[tuple[Any, OpenAI]]:
    """The built-in model served on the local engine; yields (policy holder, OpenAI client)."""
    holder, server = serve_policy(ServiceClient(base_dir=tmp_path / "engine"), MODEL, MAX_TOKENS)
    try:
        yield holder, OpenAI(base_url=server.url + "/v1", api_key="EMPTY")
    finally:
        server.stop()


def _collect(client: OpenAI, spans: Path) -> float:
    """GROUP_SIZE seeded traced rollouts per question into ``spans``; their mean reward."""
    tinkertrace.init(spans_dir=spans)
    try:
        rewards = [
            introduce(
                {"id": f"q{i}", "question": question},
                client=client,
                model=MODEL,
                max_tokens=MAX_TOKENS,
                seed=1000 * i + k,
            )["reward"]
            for i, question in enumerate(QUESTIONS)
            for k in range(GROUP_SIZE)
        ]
        assert tinkertrace.flush()
    finally:
        tinkertrace.shutdown()
    return float(np.mean(rewards))


def _mean_reward(client: OpenAI) -> float:
    """Mean identity reward of EVAL_SAMPLES seeded answers to each question (untraced)."""
    rewards = []
    for i, question in enumerate(QUESTIONS):
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": question}],
            temperature=1.0,
            max_tokens=MAX_TOKENS,
            n=EVAL_SAMPLES,
            seed=5000 + i,
        )
        rewards.extend(identity_reward(choice.message.content or "") for choice in reply.choices)
    assert len(rewards) == EVAL_SAMPLES * len(QUESTIONS)
    return float(np.mean(rewards))


def _config(tmp_path: Path, name: str) -> TrainSettings:
    return make_config(
        None,
        {
            "source": tmp_path / "spans",
            "model": MODEL,
            "groups_per_batch": 2,
            "epochs": 3,
            "learning_rate": 0.02,
            "lora_rank": 8,
            "save_every": 2,
            "log_dir": tmp_path / name,
            "engine_dir": tmp_path / "engine",
        },
    )


def test_reward_rises_on_the_same_tasks_and_resume_matches(
    tmp_path: Path, endpoint: tuple[Any, OpenAI], interrupted_at_step: Any, same_run: Any
) -> None:
    holder, client = endpoint
    collected = _collect(client, tmp_path / "spans")
    before = _mean_reward(client)
    assert 0 < collected < 0.1 and 0 < before < 0.1  # the untrained model answers near-random bytes

    straight = run_training(_config(tmp_path, "straight"), progress=False)
    assert straight.steps == 6  # 4 questions / 2 per batch x 3 epochs
    assert (tmp_path / "straight" / "build" / "trajectories.parquet").is_file()
    trained_ids = {r for c in straight.checkpoints for r in c["trained_rollout_ids"]}
    assert len(trained_ids) == GROUP_SIZE * len(QUESTIONS)  # every traced rollout, once per epoch

    holder.load(straight.final_checkpoint["sampler_path"], version=1)
    after = _mean_reward(client)
    assert after > before + 0.05 and after > 2 * before, (before, after)

    config = _config(tmp_path, "resumed")
    with interrupted_at_step(5):  # checkpoints at steps 2 and 4 survive
        run_training(config, progress=False)
    config.resume = True
    resumed = run_training(config, progress=False)
    assert (resumed.start_step, resumed.steps) == (4, 6)
    same_run(tmp_path / "straight", tmp_path / "resumed")

    holder.load(resumed.final_checkpoint["sampler_path"], version=2)
    assert _mean_reward(client) == pytest.approx(after, abs=1e-3)
