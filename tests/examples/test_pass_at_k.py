"""pass@k: the unbiased estimator on hand-computed cases, and its input checks."""

from __future__ import annotations

from math import comb

import numpy as np
import pytest

from tinkertrace.evaluation.evaluate import pass_at_k, pass_at_k_summary


def test_hand_computed_cases() -> None:
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10
    # n=4, c=0, k=2: nothing correct -> 0
    # n=4, c=3, k=2: n-c < k -> 1
    # n=10, c=3, k=1: c/n
    got = pass_at_k([5, 4, 4, 10], [2, 0, 3, 3], 2)
    assert got[:3] == pytest.approx([0.7, 0.0, 1.0], abs=1e-12)
    assert pass_at_k([10], [3], 1)[0] == pytest.approx(0.3, abs=1e-12)
    assert pass_at_k([10], [3], 2)[0] == pytest.approx(1 - comb(7, 2) / comb(10, 2), abs=1e-12)


def test_matches_binomial_formula_for_many_cases() -> None:
    rng = np.random.default_rng(0)
    n = rng.integers(5, 40, size=200)
    c = rng.integers(0, n + 1)
    for k in (1, 3, 5):
        expected = [
            1.0 if ni - ci < k else 1 - comb(ni - ci, k) / comb(ni, k) for ni, ci in zip(n, c, strict=True)
        ]
        np.testing.assert_allclose(pass_at_k(n, c, k), expected, rtol=1e-12, atol=1e-12)


def test_large_n_stays_finite() -> None:
    value = pass_at_k([2000], [1], 1000)[0]
    assert value == pytest.approx(0.5, abs=1e-12)


def test_summary_averages_tasks_and_skips_k_beyond_samples() -> None:
    summary = pass_at_k_summary(np.array([4, 4]), np.array([1, 0]), [1, 4, 8])
    assert summary == {"pass@1": pytest.approx(0.125), "pass@4": pytest.approx(0.5)}


@pytest.mark.parametrize(
    ("n", "c", "k", "message"),
    [([3], [1], 4, "at least 4 samples"), ([3], [4], 1, r"\[0, n\]"), ([3], [1], 0, "at least 1")],
)
def test_bad_input_is_named(n: list[int], c: list[int], k: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pass_at_k(n, c, k)
