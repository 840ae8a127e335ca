"""The training loop on the real local engine: metrics, checkpoints, changed weights, exact resume."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tinker import types

from tinkertrace.engine import ServiceClient
from tinkertrace.training import loop
from tinkertrace.training.checkpoints import read_checkpoints, trained_rollouts
from tinkertrace.training.config import TrainConfig, make_config
from tinkertrace.training.errors import BackendError, ConfigError
from tinkertrace.training.metrics import read_metrics

MODEL = "tinkertrace/tiny-chat:nano"
PROBE = types.ModelInput.from_ints(list(b"Q1? yes"))


def _config(tmp_path: Path, source: Path, name: str, **overrides: object) -> TrainConfig:
    settings = {
        "source": source,
        "model": MODEL,
        "groups_per_batch": 2,
        "epochs": 2,
        "save_every": 2,
        "learning_rate": 0.02,
        "lora_rank": 4,
        "log_dir": tmp_path / name,
        "engine_dir": tmp_path / "engine",
        **overrides,
    }
    return make_config(None, settings)


def _logprobs(service: ServiceClient, **where: str) -> np.ndarray:
    client = service.create_sampling_client(**where)
    return np.array(client.compute_logprobs(PROBE).result()[1:], dtype=np.float64)


def test_local_run_logs_metrics_records_checkpoints_and_changes_weights(
    tmp_path: Path, trajectories_file: Path
) -> None:
    config = _config(tmp_path, trajectories_file, "run")
    result = loop.run_training(config, progress=False)
    assert (result.start_step, result.steps, result.total_steps) == (0, 4, 4)  # 4 mixed groups / 2 x 2 epochs
    assert any("constant reward" in n for n in result.notes)

    records = read_metrics(config.log_dir)
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    for name in (
        "env/all/reward/total",
        "env/all/by_group/frac_all_good",
        "env/all/by_group/frac_mixed",
        "optim/lr",
        "optim/kl_sample_train_v1",
        "optim/kl_sample_train_v2",
        "optim/entropy",
        "progress/done_frac",
        "time/total",
        "loss:sum",
    ):
        assert all(r.get(name) is not None for r in records), name
    assert records[0]["optim/entropy"] == pytest.approx(5.5)  # the sampling logprobs written by the fixture
    assert records[-1]["progress/done_frac"] == 1.0

    checkpoints = read_checkpoints(config.log_dir)
    assert [c["step"] for c in checkpoints] == [2, 4]
    assert checkpoints[-1]["sampler_path"].startswith("tinker://")
    assert checkpoints[-1]["state_path"].startswith("tinker://")
    # each epoch trains every rollout of the 4 mixed tasks exactly once; the constant task never
    first_epoch = set(checkpoints[0]["trained_rollout_ids"])
    assert first_epoch == set(checkpoints[1]["trained_rollout_ids"]) == trained_rollouts(config.log_dir)
    assert len(first_epoch) == 17 and not any(r.startswith("rc-") for r in first_epoch)

    service = ServiceClient(base_dir=tmp_path / "engine")
    before = _logprobs(service, base_model=MODEL)
    after = _logprobs(service, model_path=checkpoints[-1]["sampler_path"])
    assert np.abs(after - before).max() > 1e-3


def test_resume_after_an_interrupt_gives_the_uninterrupted_results(
    tmp_path: Path, trajectories_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    straight = loop.run_training(_config(tmp_path, trajectories_file, "straight"), progress=False)
    assert straight.steps == 4

    real_step, calls = loop.train_step, []

    def interrupted(*args: object, **kwargs: object) -> dict[str, float]:
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real_step(*args, **kwargs)

    monkeypatch.setattr(loop, "train_step", interrupted)
    config = _config(tmp_path, trajectories_file, "resumed")
    with pytest.raises(KeyboardInterrupt):
        loop.run_training(config, progress=False)
    assert [c["step"] for c in read_checkpoints(config.log_dir)] == [2]
    monkeypatch.setattr(loop, "train_step", real_step)

    with pytest.raises(ConfigError, match="pass --resume"):
        loop.run_training(config, progress=False)
    config.resume = True
    resumed = loop.run_training(config, progress=False)
    assert (resumed.start_step, resumed.steps) == (2, 4)

    expected, got = read_metrics(tmp_path / "straight"), read_metrics(config.log_dir)
    assert [r["step"] for r in got] == [0, 1, 2, 3]  # the repeated step 2 was rewritten, not duplicated
    for a, b in zip(expected, got, strict=True):
        for name in ("loss:sum", "optim/kl_sample_train_v1", "env/all/reward/total"):
            assert b[name] == pytest.approx(a[name], rel=1e-5, abs=1e-6), (a["step"], name)
    assert [c["trained_rollout_ids"] for c in read_checkpoints(config.log_dir)] == [
        c["trained_rollout_ids"] for c in read_checkpoints(tmp_path / "straight")
    ]

    config.seed = 1
    with pytest.raises(ConfigError, match="seed changed"):
        loop.run_training(config, progress=False)


def test_unknown_model_is_one_clear_error(tmp_path: Path, trajectories_file: Path) -> None:
    config = _config(tmp_path, trajectories_file, "bad", model=str(tmp_path / "no-such-model"))
    with pytest.raises(BackendError, match="no-such-model"):
        loop.run_training(config, progress=False)
