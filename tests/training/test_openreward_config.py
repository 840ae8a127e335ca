"""The OpenReward trainer's config file, read by `tinkertrace train --config`: its keys by their names
there (aliases declared on our fields), `environments` as a mapping of OpenReward environments, unknown
keys named, `--set` with dotted keys, and the backend chosen by the Tinker API key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tinkertrace.settings import ConfigError
from tinkertrace.training.backends import resolve_backend
from tinkertrace.training.config import Environment, make_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "openreward" / "tinker-config.yaml"


def test_their_file_reads_with_the_meaning_it_has_there() -> None:
    config = make_config(EXAMPLE)
    assert (config.model, config.lora_rank, config.loss, config.groups_per_batch) == (
        "smollm2-135m-instruct",
        8,
        "ppo",
        32,
    )
    assert (config.learning_rate, config.save_every, str(config.log_dir)) == (1e-5, 10, "/tmp/tinker-rl")
    assert (config.wandb_project, config.wandb_run_name) == ("tinker-test", "tinker-rl-test-openreward")
    assert config.openreward_run_name == "tinker-rl-test-openreward" and config.backend == "auto"
    who, arith = config.environments
    assert (who.name, who.openreward, who.group_size, who.max_failing_rollouts) == (
        "whodunit",
        "whodunit",
        16,
        2,
    )
    assert (who.split, who.shuffle, who.num_samples, who.reward_reduction, who.nonterminal_reward) == (
        "train",
        True,
        None,
        "sum",
        0.0,
    )
    assert (arith.group_size, arith.temperature, arith.reward_reduction) == (8, 0.7, "mean")
    assert who.agent == arith.agent == "tinkertrace.ors.agent:run_episode"  # the built-in ORS agent
    assert who.tasks == "tinkertrace.ors.agent:load_tasks"


def test_set_overrides_with_dotted_keys(tmp_path: Path) -> None:
    edits = {
        "batch_size": "64",
        "learning_rate": "2e-5",
        "environments.arithmetic.num_rollouts": "2",
        "environments.whodunit.splits.train.num_samples": "5",
        "resume_from": "tinker://run/weights/x",
    }
    config = make_config(EXAMPLE, None, edits)
    assert (config.groups_per_batch, config.learning_rate, config.resume_from) == (
        64,
        2e-5,
        "tinker://run/weights/x",
    )
    who, arith = config.environments
    assert arith.group_size == 2 and who.num_samples == 5 and who.group_size == 16
    listed = tmp_path / "listed.yaml"
    listed.write_text("environments:\n  - {name: a, openreward: 'http://h:1/a'}\n")
    assert make_config(listed, None, {"environments.a.group_size": "3"}).environments[0].group_size == 3
    with pytest.raises(ConfigError, match="no item named 'nope'"):
        make_config(listed, None, {"environments.nope.group_size": "3"})
    with pytest.raises(ConfigError, match="no 'nope' in environments"):
        make_config(EXAMPLE, None, {"environments.nope.num_rollouts": "3"})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("batch_sise: 4\n", "unknown config file setting 'batch_sise'; known: .*batch_size"),
        ("environments:\n  x: {num_rollout: 2}\n", "unknown environments\\[0\\] setting 'num_rollout'"),
        ("batch_size: 4\ngroups_per_batch: 4\n", "'batch_size' and 'groups_per_batch' name the same setting"),
        ("environments:\n  x: {splits: {train: {}, test: {}}}\n", "splits names 2 splits"),
        (
            "environments:\n  x: {splits: {train: {shuffled: true}}}\n",
            "unknown split setting\\(s\\) shuffled",
        ),
        ("loss_fn: reinforce\n", "loss: 'reinforce' is not one of"),
    ],
)
def test_unknown_or_conflicting_keys_are_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        make_config(path)


def test_mapping_keys_name_openreward_environments() -> None:
    assert Environment.keyed("GeneralReasoning/WhoDunIt", None) == {
        "name": "GeneralReasoning.WhoDunIt",
        "openreward": "GeneralReasoning/WhoDunIt",
    }
    assert Environment.keyed("http://127.0.0.1:8080/arithmetic", {"num_rollouts": 2}) == {
        "name": "arithmetic",
        "openreward": "http://127.0.0.1:8080/arithmetic",
        "num_rollouts": 2,
    }
    assert Environment.keyed("mine", {"agent": "a.py:f", "tasks": "a.py:t"})["name"] == "mine"  # our own kind


def test_backend_auto_follows_the_tinker_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    assert resolve_backend("auto") == ("local", "backend local engine (auto: no TINKER_API_KEY)")
    monkeypatch.setenv("TINKER_API_KEY", "tml-x")
    assert resolve_backend("auto")[0] == "tinker" and resolve_backend("local")[0] == "local"
