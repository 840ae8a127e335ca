"""Advantages per mode, constant groups and by-group fractions against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest

from tinkertrace.training.advantages import (
    compute_advantages,
    constant_reward_groups,
    group_outcome_fractions,
)

GROUPS = np.array([0, 0, 0, 1, 1])
REWARDS = np.array([1.0, 0.0, 0.5, 2.0, 2.0])


def test_group_mode_centres_within_each_group() -> None:
    assert compute_advantages(GROUPS, REWARDS, "group").tolist() == [0.5, -0.5, 0.0, 0.0, 0.0]


def test_std_mode_divides_by_the_population_std_of_the_group() -> None:
    std0 = np.sqrt((0.25 + 0.25 + 0.0) / 3)
    got = compute_advantages(GROUPS, REWARDS, "std")
    np.testing.assert_allclose(got, [0.5 / std0, -0.5 / std0, 0.0, 0.0, 0.0], rtol=1e-6)


def test_none_mode_is_the_raw_reward() -> None:
    assert compute_advantages(GROUPS, REWARDS, "none").tolist() == REWARDS.tolist()


def test_groups_may_be_interleaved() -> None:
    got = compute_advantages(np.array([1, 0, 1, 0]), np.array([3.0, 1.0, 1.0, 0.0]), "group")
    assert got.tolist() == [1.0, 0.5, -1.0, -0.5]


def test_unknown_mode_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown advantage mode"):
        compute_advantages(GROUPS, REWARDS, "rank")  # type: ignore[arg-type]


def test_constant_groups_include_singletons() -> None:
    groups = np.array([0, 0, 1, 1, 2])
    rewards = np.array([1.0, 0.0, 3.0, 3.0, 7.0])
    assert constant_reward_groups(groups, rewards).tolist() == [False, True, True]


def test_by_group_fractions() -> None:
    groups = np.array([0, 0, 1, 1, 2, 2])
    rewards = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    assert group_outcome_fractions(groups, rewards) == pytest.approx(
        {"frac_mixed": 1 / 3, "frac_all_good": 1 / 3, "frac_all_bad": 1 / 3}
    )
