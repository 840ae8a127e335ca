"""Per-trajectory advantages from rewards, computed within groups (GRPO-style), with numpy.

Inputs are flat arrays with one entry per trajectory: ``group_index`` (0..G-1) and ``rewards``.
Modes (the cookbook's estimators):

- ``group``: ``A_i = R_i - mean(R_group)`` (the cookbook's GRPO default, no std scaling);
- ``std``: ``A_i = (R_i - mean(R_group)) / (std(R_group) + eps)`` with the population std;
- ``none``: ``A_i = R_i`` (plain REINFORCE, no baseline).
"""

from __future__ import annotations

from typing import get_args

import numpy as np

from tinkertrace.training.config import AdvantageMode

ADVANTAGE_MODES: tuple[str, ...] = get_args(AdvantageMode)  # declared with the settings (training.config)


def _group_means(group_index: np.ndarray, values: np.ndarray, n_groups: int) -> np.ndarray:
    counts = np.bincount(group_index, minlength=n_groups)
    sums = np.bincount(group_index, weights=values, minlength=n_groups)
    return sums / np.maximum(counts, 1)


def compute_advantages(
    group_index: np.ndarray, rewards: np.ndarray, mode: AdvantageMode = "group", eps: float = 1e-8
) -> np.ndarray:
    """Advantage of each trajectory given its group and reward (float64, same length as ``rewards``)."""
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"unknown advantage mode {mode!r}; choose one of {', '.join(ADVANTAGE_MODES)}")
    rewards = np.asarray(rewards, dtype=np.float64)
    group_index = np.asarray(group_index, dtype=np.int64)
    if mode == "none":
        return rewards.copy()
    n_groups = int(group_index.max()) + 1 if len(group_index) else 0
    centred = rewards - _group_means(group_index, rewards, n_groups)[group_index]
    if mode == "group":
        return centred
    variance = _group_means(group_index, centred**2, n_groups)
    return centred / (np.sqrt(variance)[group_index] + eps)


def constant_reward_groups(group_index: np.ndarray, rewards: np.ndarray) -> np.ndarray:
    """Boolean per group: True where every trajectory in the group has the same reward.

    A group of one trajectory counts as constant (its centred advantage is always 0).
    """
    group_index = np.asarray(group_index, dtype=np.int64)
    rewards = np.asarray(rewards, dtype=np.float64)
    n_groups = int(group_index.max()) + 1 if len(group_index) else 0
    lo = np.full(n_groups, np.inf)
    hi = np.full(n_groups, -np.inf)
    np.minimum.at(lo, group_index, rewards)
    np.maximum.at(hi, group_index, rewards)
    return lo == hi


def group_outcome_fractions(
    group_index: np.ndarray, rewards: np.ndarray, good_threshold: float = 0.5
) -> dict[str, float]:
    """The cookbook's ``by_group`` fractions: all-good, all-bad (constant groups) and mixed groups."""
    group_index = np.asarray(group_index, dtype=np.int64)
    rewards = np.asarray(rewards, dtype=np.float64)
    if len(group_index) == 0:
        return {"frac_mixed": 0.0, "frac_all_good": 0.0, "frac_all_bad": 0.0}
    present, first_row = np.unique(group_index, return_index=True)
    constant = constant_reward_groups(group_index, rewards)[present]
    good = rewards[first_row] >= good_threshold  # all rewards of a constant group are equal
    n = len(present)
    return {
        "frac_mixed": float(np.count_nonzero(~constant)) / n,
        "frac_all_good": float(np.count_nonzero(constant & good)) / n,
        "frac_all_bad": float(np.count_nonzero(constant & ~good)) / n,
    }
