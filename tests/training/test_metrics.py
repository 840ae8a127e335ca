"""KL metrics and the metrics.jsonl writer."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tinkertrace.training.metrics import MetricsLogger, kl_sample_train, read_metrics


def test_kl_sample_train_uses_only_sampled_tokens() -> None:
    sampling = [np.array([0.0, -1.0, -2.0], np.float32)]
    training = [np.array([-5.0, -1.5, -1.0], np.float32)]  # position 0 is an observation: ignored
    masks = [np.array([0.0, 1.0, 1.0], np.float32)]
    got = kl_sample_train(sampling, training, masks)
    # diffs over actions: 0.5 and -1.0
    assert got == pytest.approx(
        {"optim/kl_sample_train_v1": -0.25, "optim/kl_sample_train_v2": 0.3125, "optim/entropy": 1.5}
    )
    assert kl_sample_train(sampling, training, [np.zeros(3, np.float32)]) == {}


def test_logger_writes_one_line_per_step_and_resume_drops_repeated_steps(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path) as log:
        for step in range(3):
            log.log(step, {"optim/lr": 0.1, "env/all/reward/total": np.float32(step), "bad": float("nan")})
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [0, 1, 2]
    assert json.loads(lines[2]) == {"step": 2, "optim/lr": 0.1, "env/all/reward/total": 2.0, "bad": None}
    with MetricsLogger(tmp_path, start_step=1) as log:
        log.log(1, {"optim/lr": 0.2})
    assert [(r["step"], r["optim/lr"]) for r in read_metrics(tmp_path)] == [(0, 0.1), (1, 0.2)]


def test_wandb_configured_but_missing_is_a_note_not_a_crash(tmp_path: Path) -> None:
    pytest.importorskip("numpy")
    try:
        import wandb  # noqa: F401

        pytest.skip("wandb is installed here")
    except ImportError:
        pass
    with MetricsLogger(tmp_path, wandb_project="demo") as log:
        log.log(0, {"x": 1})
    assert any("wandb package is not installed" in n for n in log.notes)
