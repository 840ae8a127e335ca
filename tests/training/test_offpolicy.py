"""The corrected (decoupled PPO, truncated importance weight) loss: value and gradient against the
per-token reference, built from Tinker's own losses as the trainer builds it; and the mismatch metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tinkertrace.engine.losses import get_loss
from tinkertrace.training.offpolicy import (
    clipped_fraction,
    corrected_inputs,
    decoupled_ppo_reference,
    mismatch_metrics,
    truncated_weights,
)

# six trained tokens and one prompt token (mask 0): learner, proximal (trainer at step start) and
# behaviour (sampler) logprobs, chosen so that some weights are truncated and some ratios clipped
LEARNER = np.array([-0.5, -1.0, -2.0, -0.1, -3.0, -0.7, -1.2])
PROXIMAL = np.array([-0.6, -0.4, -2.1, -0.9, -2.2, -0.7, -9.0])
BEHAVIOUR = np.array([-0.6, -1.9, -2.0, -0.2, -2.0, -2.5, -0.3])
ADVANTAGE = np.array([1.0, -1.0, 0.5, 2.0, -0.5, 1.5, 0.0])
MASK = np.array([1, 1, 1, 1, 1, 1, 0])
CAP = 2.0


def engine_value_and_grad(name: str, low: float = 0.8, high: float = 1.2) -> tuple[np.ndarray, np.ndarray]:
    """The engine's built-in loss on the corrected Datum inputs: per-token value and d/d learner."""
    logprobs, advantages = corrected_inputs(PROXIMAL, BEHAVIOUR, ADVANTAGE * MASK, MASK, CAP)
    config = {"clip_low_threshold": low, "clip_high_threshold": high} if name == "ppo" else None
    spec, cfg = get_loss(name, config)
    learner = torch.tensor(LEARNER, dtype=torch.float64, requires_grad=True)
    inputs = {
        "logprobs": torch.tensor(logprobs, dtype=torch.float64),
        "advantages": torch.tensor(advantages, dtype=torch.float64),
    }
    per_token = spec.fn(learner, inputs, cfg)
    per_token.sum().backward()
    assert learner.grad is not None
    return per_token.detach().numpy(), learner.grad.numpy()


@pytest.mark.parametrize(("low", "high"), [(0.8, 1.2), (0.5, 1.5)])
def test_ppo_on_corrected_inputs_is_the_decoupled_loss(low: float, high: float) -> None:
    loss, grad = engine_value_and_grad("ppo", low, high)
    trained = MASK > 0
    want_loss, want_grad = decoupled_ppo_reference(
        LEARNER[trained].tolist(), PROXIMAL[trained].tolist(), BEHAVIOUR[trained].tolist(),
        ADVANTAGE[trained].tolist(), cap=CAP, low=low, high=high,
    )  # fmt: skip
    np.testing.assert_allclose(loss[trained], want_loss, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(grad[trained], want_grad, rtol=1e-6, atol=1e-7)
    assert loss[~trained] == pytest.approx(0.0) and grad[~trained] == pytest.approx(0.0)
    if (low, high) == (0.8, 1.2):
        # token 1: exp(-0.4 + 1.9) = 4.5 is truncated to CAP; token 3: ratio to the proximal policy
        # exp(-0.1 + 0.9) = 2.2 > 1.2 with A > 0 -> clipped, no gradient, whatever the sampler was
        assert grad[3] == 0
        assert want_loss[1] == pytest.approx(-CAP * min(np.exp(-1.0 + 0.4) * -1.0, 0.8 * -1.0))


def test_importance_sampling_on_corrected_inputs_is_the_weighted_ratio() -> None:
    loss, grad = engine_value_and_grad("importance_sampling")
    weight = np.minimum(np.exp(PROXIMAL - BEHAVIOUR), CAP) * MASK
    ratio = np.exp(LEARNER - PROXIMAL)
    np.testing.assert_allclose(loss, -weight * ratio * ADVANTAGE, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(grad, -weight * ratio * ADVANTAGE, rtol=1e-6, atol=1e-7)


def test_weights_truncate_at_the_cap_and_are_one_on_policy() -> None:
    weights = truncated_weights(PROXIMAL, BEHAVIOUR, CAP)
    np.testing.assert_allclose(weights, np.minimum(np.exp(PROXIMAL - BEHAVIOUR), CAP))
    assert weights.max() == CAP and weights[0] == 1.0
    assert np.isfinite(truncated_weights(np.array([500.0]), np.array([-500.0]), CAP)).all()  # no overflow


def test_mismatch_metrics() -> None:
    on_policy = mismatch_metrics([BEHAVIOUR], [BEHAVIOUR], [MASK], CAP)
    assert on_policy["offpolicy/mismatch_kl"] == 0.0 and on_policy["offpolicy/truncated_frac"] == 0.0
    off = mismatch_metrics([BEHAVIOUR], [PROXIMAL], [MASK], CAP)
    ratio = np.exp(PROXIMAL - BEHAVIOUR)[:6]
    assert off["offpolicy/mismatch_kl"] == pytest.approx(np.mean(ratio - 1 - np.log(ratio)))
    assert off["offpolicy/truncated_frac"] == pytest.approx(2 / 6)  # tokens 1 and 5 (the masked one ignored)
    assert "offpolicy/truncated_frac" not in mismatch_metrics([BEHAVIOUR], [PROXIMAL], [MASK], None)
    assert mismatch_metrics([], [], [], CAP) == {}


def test_mismatch_kl_by_token_age() -> None:
    """Each age bucket's figure is the k3 mean over its own trained tokens (the prompt token left out),
    ages 4 and over share one bucket, an age with no trained token has no figure, and the overall
    figure is the buckets' token-weighted mean."""
    ages = np.array([0, 0, 1, 1, 5, 4, 2])  # the last (prompt, mask 0) would be the only age-2 token
    metrics = mismatch_metrics([BEHAVIOUR], [PROXIMAL], [MASK], CAP, [ages])
    log_ratio = PROXIMAL - BEHAVIOUR
    k3 = np.exp(log_ratio) - 1 - log_ratio
    assert metrics["offpolicy/mismatch_kl_age_0"] == pytest.approx(k3[:2].mean())
    assert metrics["offpolicy/mismatch_kl_age_1"] == pytest.approx(k3[2:4].mean())
    assert metrics["offpolicy/mismatch_kl_age_4+"] == pytest.approx(k3[4:6].mean())
    assert not {"offpolicy/mismatch_kl_age_2", "offpolicy/mismatch_kl_age_3"} & set(metrics)
    by_age = [metrics[f"offpolicy/mismatch_kl_age_{a}"] for a in ("0", "1", "4+")]
    assert metrics["offpolicy/mismatch_kl"] == pytest.approx(np.mean(by_age))  # two tokens each
    assert not any("age" in k for k in mismatch_metrics([BEHAVIOUR], [PROXIMAL], [MASK], CAP))


def test_clipped_fraction_counts_ratios_outside_the_clip_range() -> None:
    ratio = np.exp(LEARNER - BEHAVIOUR)[:6]
    want = np.mean((ratio < 0.8) | (ratio > 1.2))
    assert clipped_fraction([LEARNER], [BEHAVIOUR], [MASK], 0.8, 1.2) == pytest.approx(want)
    assert clipped_fraction([LEARNER], [LEARNER], [MASK], 0.8, 1.2) == 0.0
