"""The hosted path end to end: `tinkertrace train --backend tinker` and `tinkertrace serve --backend
tinker` reach Tinker only through the real, unchanged ``tinker.ServiceClient``, here pointed at a real
`tinkertrace engine` process with ``TINKER_BASE_URL`` and a dummy key. Everything the SDK does
(protobuf Datums, futures and their polling, sessions, sampling sessions, checkpoint paths) runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
from typer.testing import CliRunner

from tinkertrace.cli.main import app
from tinkertrace.engine import ServiceClient as LocalServiceClient
from tinkertrace.engine_server import EngineSettings, create_app
from tinkertrace.engine_server.process import EngineProcess
from tinkertrace.netutil import BackgroundServer, free_port, wait_for_port
from tinkertrace.training.checkpoints import read_checkpoints
from tinkertrace.training.metrics import read_metrics

MODEL = "tinkertrace/tiny-chat:nano"
TRAIN_ARGS = ["--model", MODEL, "--lora-rank", "4", "--groups-per-batch", "2", "--seed", "3", "--no-progress"]
TRAIN_ARGS += ["--learning-rate", "5e-3", "--save-every", "2"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineProcess]:
    with EngineProcess(tmp_path_factory.mktemp("hosted") / "engine") as running:
        yield running


@pytest.fixture
def hosted_env(engine: EngineProcess, monkeypatch: pytest.MonkeyPatch) -> EngineProcess:
    for name, value in engine.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TINKERTRACE_CPU_THREADS", "1")
    return engine


def _train(*args: str) -> None:
    result = CliRunner().invoke(app, ["train", *args])
    assert result.exit_code == 0, result.output + repr(result.exception)


def loss_curves(local_dir: Path, hosted_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """Per-step ``loss:sum`` of two runs."""
    return (
        np.array([m["loss:sum"] for m in read_metrics(local_dir)]),
        np.array([m["loss:sum"] for m in read_metrics(hosted_dir)]),
    )


def test_train_backend_tinker_has_the_local_loss_curve_and_resumes(
    tmp_path: Path, trajectories_file: Path, hosted_env: EngineProcess
) -> None:
    hosted, local = tmp_path / "hosted", tmp_path / "local"
    _train(
        str(trajectories_file), "--backend", "tinker", "--log-dir", str(hosted), "--epochs", "1", *TRAIN_ARGS
    )
    _train(str(trajectories_file), "--backend", "tinker", "--log-dir", str(hosted), "--epochs", "2",
           "--resume", *TRAIN_ARGS)  # fmt: skip
    _train(str(trajectories_file), "--backend", "local", "--engine-dir", str(tmp_path / "engine"),
           "--log-dir", str(local), "--epochs", "2", *TRAIN_ARGS)  # fmt: skip

    want, got = loss_curves(local, hosted)
    assert len(got) == len(want) >= 4 and len(set(got.round(4))) > 1
    np.testing.assert_allclose(got, want, rtol=1e-5)  # docs/training.md states this tolerance
    records = read_checkpoints(hosted)
    assert all(r["state_path"].startswith("tinker://") and ":train:" in r["state_path"] for r in records)
    # The first run's session trained run :train:0; the resumed run is a new model of a new session.
    assert len({r["state_path"].split("/")[2] for r in records}) == 2
    run_id = records[-1]["sampler_path"].split("/")[2]
    assert (
        hosted_env.engine_dir / run_id / "sampler_weights" / records[-1]["name"] / "trainable.safetensors"
    ).is_file()  # a LoRA run's sampler weights: its LoRA weights alone


def test_substeps_through_the_sdk_match_the_local_engine(
    tmp_path: Path, trajectories_file: Path, hosted_env: EngineProcess
) -> None:
    """Two optimiser steps per step: four requests pipelined through the SDK before any is awaited
    run in their order (the engine sequences a model's calls), so the curve is the local one."""
    hosted, local = tmp_path / "hosted", tmp_path / "local"
    args = [str(trajectories_file), "--epochs", "1", "--num-substeps", "2", *TRAIN_ARGS]
    _train("--backend", "tinker", "--log-dir", str(hosted), *args)
    _train("--backend", "local", "--engine-dir", str(tmp_path / "engine"), "--log-dir", str(local), *args)

    want, got = loss_curves(local, hosted)
    assert len(got) == len(want) >= 2
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert all(m["optim/substeps"] == 2 for m in read_metrics(hosted))


def test_serve_backend_tinker_samples_through_the_sdk(
    tmp_path: Path, trajectories_file: Path, hosted_env: EngineProcess
) -> None:
    log_dir = tmp_path / "run"
    _train(str(trajectories_file), "--backend", "tinker", "--log-dir", str(log_dir), *TRAIN_ARGS)
    sampler_path = read_checkpoints(log_dir)[-1]["sampler_path"]
    port = free_port()
    cmd = [sys.executable, "-m", "tinkertrace.cli.main", "serve", "--backend", "tinker", "--model", MODEL]
    cmd += ["--model-path", sampler_path, "--port", str(port), "--policy-version", "3"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        wait_for_port(port, timeout=90)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY", max_retries=0)
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Q1?"}],
            max_tokens=4,
            n=2,
            logprobs=True,
            top_logprobs=2,
        )
        assert reply.model_extra["policy_version"] == 3 and len(reply.choices) == 2
        for choice in reply.choices:
            token_ids = choice.model_extra["token_ids"]
            assert 1 <= len(token_ids) <= 4 and len(choice.logprobs.content) == len(token_ids)
            assert all(len(lp.top_logprobs) == 2 for lp in choice.logprobs.content)
        assert reply.model_extra["prompt_token_ids"][:1] == [257]  # <|im_start|>: the chat template ran
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
    assert "backend tinker" in stderr


def test_a_key_the_engine_refuses_is_one_message(
    tmp_path: Path, trajectories_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = EngineSettings(api_key="tml-the-right-key")
    with BackgroundServer(create_app(LocalServiceClient(tmp_path / "engine"), settings)) as server:
        monkeypatch.setenv("TINKER_BASE_URL", server.url)
        monkeypatch.setenv("TINKER_API_KEY", "tml-a-wrong-key")
        args = ["train", str(trajectories_file), "--backend", "tinker", "--model", MODEL, "--no-progress"]
        result = CliRunner().invoke(app, [*args, "--log-dir", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert (
        "could not open a training client" in result.output and "invalid or missing API key" in result.output
    )
    assert "Traceback" not in result.output
