"""`tinkertrace train` from the command line: config file + options, and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tinkertrace.cli.main import app
from tinkertrace.netutil import free_port

runner = CliRunner()


def test_train_with_config_file_and_overrides(tmp_path: Path, trajectories_file: Path) -> None:
    config = tmp_path / "train.toml"
    config.write_text(
        '[train]\nmodel = "tinkertrace/tiny-chat:nano"\ngroups_per_batch = 2\nlora_rank = 4\nepochs = 5\n'
        f'engine_dir = "{tmp_path / "engine"}"\n'
    )
    log_dir = tmp_path / "cli"
    result = runner.invoke(
        app,
        [
            "train", str(trajectories_file), "--config", str(config), "--epochs", "1",
            "--log-dir", str(log_dir), "--loss", "ppo", "--loss-config", "clip_low_threshold=0.8",
            "--loss-config", "clip_high_threshold=1.2", "--no-progress",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "sampler weights: tinker://" in result.output
    saved = json.loads((log_dir / "config.json").read_text())
    assert saved["epochs"] == 1 and saved["groups_per_batch"] == 2 and saved["loss"] == "ppo"
    assert saved["loss_config"] == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    assert len((log_dir / "metrics.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TINKER_API_KEY": ""}, "needs an API key: export TINKER_API_KEY"),
        (
            {"TINKER_API_KEY": "tml-x", "TINKER_BASE_URL": "http://127.0.0.1:{port}"},
            "cannot reach the Tinker service",
        ),
    ],
)
def test_hosted_backend_problems_are_one_message_without_traceback(
    tmp_path: Path,
    trajectories_file: Path,
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    message: str,
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value.format(port=free_port()))
    args = ["train", str(trajectories_file), "--backend", "tinker", "--model", "Qwen/Qwen3-8B"]
    result = runner.invoke(app, [*args, "--log-dir", str(tmp_path / "x"), "--no-progress"])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_bad_option_values_are_reported(tmp_path: Path, trajectories_file: Path) -> None:
    result = runner.invoke(app, ["train", str(trajectories_file), "--advantage", "rank", "--no-progress"])
    assert result.exit_code == 2 and "advantage: 'rank' is not one of group, std, none" in result.output
    result = runner.invoke(app, ["train", str(tmp_path / "nothing"), "--no-progress"])
    assert result.exit_code == 2 and "does not exist" in result.output
