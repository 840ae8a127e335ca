"""Command-line options made from the settings dataclasses: every setting is written once."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
import typer
from typer.testing import CliRunner

from tinkertrace.cli.main import app
from tinkertrace.cli.options import OptionsOf, cli_fields, with_settings
from tinkertrace.evaluation.settings import EvalSettings
from tinkertrace.models.tokenizer import BUILTIN_MODEL
from tinkertrace.online.settings import DemoSettings, FollowSettings
from tinkertrace.settings import setting
from tinkertrace.training.advantages import ADVANTAGE_MODES
from tinkertrace.training.config import TrainSettings
from tinkertrace.training.datums import LOSS_FUNCTIONS


@dataclass
class Toy:
    name: str = setting("a", "The name.")
    count: int = setting(2, "How many.", flags=("--how-many", "-n"))
    mode: Literal["x", "y"] = setting("x", "A choice.")
    pairs: dict[str, float] = setting(help="key=value, repeatable.", default_factory=dict)
    loud: bool = setting(False, "Shout.")
    hidden: float = setting(1.5, "File only.", cli=False)


def _toy_app(seen: list[dict[str, Any]]) -> typer.Typer:
    toy = typer.Typer()

    @toy.command()
    @with_settings
    def run(verbose: bool = False, settings: dict[str, Any] = OptionsOf(Toy, "toy: ")) -> None:
        seen.append({"verbose": verbose, **settings})

    @toy.command()
    def other() -> None:
        pass

    return toy


def test_only_given_options_reach_the_command() -> None:
    seen: list[dict[str, Any]] = []
    toy = _toy_app(seen)
    assert CliRunner().invoke(toy, ["run"]).exit_code == 0
    args = ["run", "-n", "3", "--mode", "y", "--pairs", "a=1", "--pairs", "b=2", "--loud", "--verbose"]
    result = CliRunner().invoke(toy, args)
    assert result.exit_code == 0, result.output
    assert seen == [
        {"verbose": False},
        {"verbose": True, "count": 3, "mode": "y", "pairs": ["a=1", "b=2"], "loud": True},
    ]
    given_default = CliRunner().invoke(toy, ["run", "--name", "a"])  # the default, but given: it counts
    assert given_default.exit_code == 0 and seen[-1] == {"verbose": False, "name": "a"}
    assert CliRunner().invoke(toy, ["run", "--hidden", "2"]).exit_code == 2  # file-only: no option


def test_help_shows_each_fields_text_and_default() -> None:
    result = CliRunner().invoke(_toy_app([]), ["run", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for text in (
        "toy: the name.",
        "[default: a]",
        "--how-many",
        "[default: 2]",
        "toy: a choice.",
        "--no-loud",
    ):
        assert text in result.output
    assert "hidden" not in result.output


def _options_of(command: str) -> set[str]:
    """The option names a command's help lists."""
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "300"})
    assert result.exit_code == 0
    return {word.strip("│,") for word in result.output.split() if word.startswith("--")}


@pytest.mark.parametrize(
    ("command", "settings"),
    [("train", TrainSettings), ("train", FollowSettings), ("demo", DemoSettings), ("eval", EvalSettings)],
)
def test_every_command_line_field_is_an_option_with_help(command: str, settings: type) -> None:
    listed = _options_of(command)
    for field in dataclasses.fields(settings):
        assert field.metadata.get("help"), f"{settings.__name__}.{field.name} has no help text"
    for field in cli_fields(settings):
        if field.metadata["argument"]:
            continue
        flags = field.metadata["flags"] or (f"--{field.name.replace('_', '-')}",)
        assert flags[0].split("/")[0] in listed, field.name


def test_train_help_names_the_file_only_settings() -> None:
    result = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "300"})
    for field in dataclasses.fields(TrainSettings):
        if not field.metadata["cli"]:
            assert field.name in result.output


def test_config_choices_match_what_the_training_code_accepts() -> None:
    hints = typing.get_type_hints(TrainSettings)
    assert set(typing.get_args(hints["loss"])) == set(LOSS_FUNCTIONS)  # derived from one Literal
    assert set(typing.get_args(hints["advantage"])) == set(ADVANTAGE_MODES)
    assert TrainSettings().model == BUILTIN_MODEL


def test_a_config_file_value_is_not_overridden_by_an_option_left_at_its_default(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("groups_per_batch: 0\n")  # invalid, so training stops at the config
    result = CliRunner().invoke(app, ["train", str(tmp_path), "--config", str(config), "--no-progress"])
    assert result.exit_code == 2 and "groups_per_batch must be at least 1" in result.output
