"""Config from YAML/TOML files with command-line overrides, and clear errors for bad settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from tinkertrace.settings import ConfigError, parse_key_values
from tinkertrace.training.config import TrainSettings, make_config


def test_defaults_are_valid() -> None:
    config = make_config()
    assert config == TrainSettings()
    assert config.advantage == "group" and config.backend == "auto"  # tinker with TINKER_API_KEY, else local


def test_yaml_file_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text(
        "epochs: 3\nlearning-rate: 0.001\nloss: ppo\n"
        "loss_config: {clip_low_threshold: 0.8, clip_high_threshold: 1.2}\n"
        "log_dir: runs/x\n"
    )
    config = make_config(path, {"epochs": 5, "loss_config": {"clip_high_threshold": 1.5}, "seed": None})
    assert config.epochs == 5  # the option wins
    assert config.learning_rate == 0.001
    assert config.loss == "ppo"
    assert config.loss_config == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.5}
    assert config.log_dir == Path("runs/x") and config.seed == 0


def test_toml_file_under_a_train_table(tmp_path: Path) -> None:
    path = tmp_path / "train.toml"
    path.write_text(
        '[train]\nbackend = "tinker"\nmodel = "Qwen/Qwen3-8B"\nremove_constant_reward_groups = false\n'
    )
    config = make_config(path)
    assert (config.backend, config.model, config.remove_constant_reward_groups) == (
        "tinker",
        "Qwen/Qwen3-8B",
        False,
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("epoch: 2\n", "unknown config file setting 'epoch'"),
        ("advantage: rank\n", "advantage: 'rank' is not one of group, std, none"),
        ("epochs: two\n", "epochs: 'two' is not a valid int"),
        ("epochs: 0\n", "epochs must be at least 1"),
        ("[1, 2]\n", "must hold a mapping"),
        ("epochs: [\n", "is not valid"),
    ],
)
def test_bad_settings_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        make_config(path)


def test_missing_file_and_bad_key_values() -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        make_config(Path("/nonexistent/train.yaml"))
    given = make_config(None, {"loss_config": ["beta=0.1", "a=1,b=2"]})
    assert given.loss_config == {"beta": 0.1, "a": 1.0, "b": 2.0}
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_key_values(["beta"], "loss_config")
    with pytest.raises(ConfigError, match=r"loss_config\.beta: 'high' is not a valid float"):
        make_config(None, {"loss_config": ["beta=high"]})
