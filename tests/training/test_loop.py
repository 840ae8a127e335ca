"""The training loop on the real local engine: metrics, checkpoints, changed weights, exact resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tinker import types

from tinkertrace import schemas
from tinkertrace.engine import ServiceClient
from tinkertrace.settings import ConfigError
from tinkertrace.training import loop
from tinkertrace.training.checkpoints import read_checkpoints
from tinkertrace.training.config import TrainSettings, make_config
from tinkertrace.training.errors import BackendError
from tinkertrace.training.metrics import read_metrics
from tinkertrace.training.outcomes import read_outcomes

MODEL = "tinkertrace/tiny-chat:nano"
PROBE = types.ModelInput.from_ints(list(b"Q1? yes"))


def trained_rollouts(log_dir: Path) -> set[str]:
    """Every rollout id recorded as trained in ``log_dir``'s checkpoints."""
    return {rid for record in read_checkpoints(log_dir) for rid in record.get("trained_rollout_ids", [])}


def _config(tmp_path: Path, source: Path, name: str, **overrides: object) -> TrainSettings:
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

    # outcomes.jsonl: every trained row with its step (the metrics' numbering), the constant group's
    # rows dropped with their reason before any step
    outcomes = read_outcomes(config.log_dir)
    trained = [o for o in outcomes if o["outcome"] == "trained"]
    assert {o["rollout_id"] for o in trained} == first_epoch
    assert sorted({o["step"] for o in trained}) == [r["step"] for r in records]
    per_step = {s: sum(o["tokens"] - 1 for o in trained if o["step"] == s) for s in range(4)}
    assert all(per_step[r["step"]] == r["data/num_tokens"] for r in records)  # the Datums' inputs
    dropped = [o for o in outcomes if o["outcome"] == "dropped"]
    assert dropped and all(o["rollout_id"].startswith("rc-") for o in dropped)
    assert {(o["reason"], o["step"]) for o in dropped} == {("constant_reward", None)}

    service = ServiceClient(base_dir=tmp_path / "engine")
    before = _logprobs(service, base_model=MODEL)
    after = _logprobs(service, model_path=checkpoints[-1]["sampler_path"])
    assert np.abs(after - before).max() > 1e-3


def test_resume_after_an_interrupt_gives_the_uninterrupted_results(
    tmp_path: Path, trajectories_file: Path, interrupted_at_step: Any, same_run: Any
) -> None:
    straight = loop.run_training(_config(tmp_path, trajectories_file, "straight"), progress=False)
    assert straight.steps == 4

    config = _config(tmp_path, trajectories_file, "resumed")
    with interrupted_at_step(4):
        loop.run_training(config, progress=False)
    assert [c["step"] for c in read_checkpoints(config.log_dir)] == [2]

    with pytest.raises(ConfigError, match="pass --resume"):
        loop.run_training(config, progress=False)
    config.resume = True
    resumed = loop.run_training(config, progress=False)
    assert (resumed.start_step, resumed.steps) == (2, 4)
    assert [r["step"] for r in read_metrics(config.log_dir)] == [0, 1, 2, 3]
    same_run(tmp_path / "straight", config.log_dir)

    config.seed = 1
    with pytest.raises(ConfigError, match="seed changed"):
        loop.run_training(config, progress=False)


def test_unknown_model_is_one_clear_error(tmp_path: Path, trajectories_file: Path) -> None:
    config = _config(tmp_path, trajectories_file, "bad", model=str(tmp_path / "no-such-model"))
    with pytest.raises(BackendError, match="no-such-model"):
        loop.run_training(config, progress=False)


def test_bad_rows_are_reported_and_the_rest_is_trained(tmp_path: Path, make_trajectories: Any) -> None:
    rows = make_trajectories(num_tasks=2, per_task=4).to_pylist()[:8]
    rows[0].update(tokens=[], logprobs=[], action_mask=[])  # an empty trajectory
    rows[1]["reward"] = float("nan")
    rows[4]["tokens"] = rows[4]["tokens"] + list(b" and more")  # over the limit below
    rows[4]["logprobs"] = rows[4]["logprobs"] + [-5.5] * 9
    rows[4]["action_mask"] = rows[4]["action_mask"] + [1] * 9
    source = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=schemas.trajectories()), source)

    config = _config(tmp_path, source, "run", epochs=1, max_tokens_per_datum=8)
    result = loop.run_training(config, progress=False)
    notes = " ".join(result.notes)
    assert "1 trajectory rows with a missing or NaN reward" in notes
    assert "1 sequences were longer than max_tokens_per_datum=8" in notes
    assert "1 sequences had no sampled token" in notes
    trained = trained_rollouts(config.log_dir)
    assert trained == {r["rollout_id"] for r in rows} - {rows[0]["rollout_id"], rows[1]["rollout_id"]}
