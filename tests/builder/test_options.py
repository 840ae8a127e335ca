"""``BuildSettings``: choices from their ``Literal`` types and every problem in one ConfigError, whether
built in code or from the command line's options."""

from __future__ import annotations

from typing import get_args

import pytest

from tinkertrace.builder.options import BuildSettings, GroupBy, RewardPolicy
from tinkertrace.cli.options import validated
from tinkertrace.settings import ConfigError


def test_choices_are_the_literals() -> None:
    for policy in get_args(RewardPolicy):
        for group_by in get_args(GroupBy):
            assert BuildSettings(reward_policy=policy, group_by=group_by).reward_policy == policy
    with pytest.raises(ConfigError, match="reward_policy must be one of nearest, sibling, link, final"):
        BuildSettings(reward_policy="closest")  # type: ignore[arg-type]


def test_every_problem_is_named_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        BuildSettings(group_by="agent", buckets=0, statuses=("done",), task_key="")  # type: ignore[arg-type]
    message = str(caught.value)
    assert message.startswith("invalid build settings: ")
    for problem in ("group_by must be one of task, task+agent", "buckets must be between 1 and 256",
                    "statuses must be among", "task_key must name an attribute"):  # fmt: skip
        assert problem in message


def test_collections_are_stored_immutably() -> None:
    options = BuildSettings(splits=["train"], exclude_rollouts=["r1", "r1"], files=["a.parquet"])  # type: ignore[arg-type]
    assert options.splits == ("train",) and options.exclude_rollouts == frozenset({"r1"})
    assert options.files is not None and str(options.files[0]) == "a.parquet"


def test_options_given_as_text_are_coerced_then_checked() -> None:
    options = validated(BuildSettings, {"reward_policy": "final", "buckets": "4", "status": None})
    assert (options.reward_policy, options.buckets) == ("final", 4)
    with pytest.raises(Exception, match="--buckets must be between"):
        validated(BuildSettings, {"buckets": "300"})
