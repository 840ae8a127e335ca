"""End to end: real traced rollouts (SDK + real OpenAI client + test server) → spans → build → train."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

import tinkertrace
from tinkertrace.training.checkpoints import read_checkpoints
from tinkertrace.training.config import make_config
from tinkertrace.training.loop import run_training
from tinkertrace.training.metrics import read_metrics


@pytest.mark.slow
def test_spans_folder_is_built_then_trained(tmp_path: Path, openai_server: Any) -> None:
    spans = tmp_path / "spans"
    tinkertrace.init(spans_dir=spans)
    client = openai.OpenAI(base_url=openai_server.base_url, api_key="test")
    try:

        @tinkertrace.traced_rollout
        def solve(task: dict[str, Any]) -> None:
            reply = client.chat.completions.create(
                model="test-model", messages=[{"role": "user", "content": task["q"]}]
            )
            tinkertrace.emit_reward(float(task["attempt_reward"]))
            assert reply.choices[0].message.content

        for t in range(3):
            for k in range(3):
                solve({"id": f"task-{t}", "q": f"question {t}", "attempt_reward": k % 2})
        tinkertrace.flush()
    finally:
        tinkertrace.shutdown()

    config = make_config(
        None,
        {
            "source": spans,
            "model": "tinkertrace/tiny-chat:nano",
            "groups_per_batch": 2,
            "lora_rank": 4,
            "log_dir": tmp_path / "run",
            "engine_dir": tmp_path / "engine",
        },
    )
    result = run_training(config, progress=False)
    assert (tmp_path / "run" / "build" / "trajectories.parquet").is_file()
    assert result.steps == 2  # 3 mixed groups in batches of 2
    metrics = read_metrics(config.log_dir)
    assert all(r["env/all/reward/total"] == pytest.approx(1 / 3) for r in metrics)
    assert all(r["env/all/total_episodes"] in (3, 6) for r in metrics)
    assert len({rid for c in read_checkpoints(config.log_dir) for rid in c["trained_rollout_ids"]}) == 9
