"""Each built-in loss's value and gradient against a direct computation from its formula."""

from __future__ import annotations

import pytest
import torch

from tinkertrace.engine.losses import LOSSES, get_loss

LP = torch.tensor([-0.5, -1.0, -2.0, -0.1, -3.0], dtype=torch.float64)
SAMPLING = torch.tensor([-0.7, -0.2, -2.0, -1.5, -2.9], dtype=torch.float64)
ADV = torch.tensor([1.0, -1.0, 0.5, 2.0, -0.5], dtype=torch.float64)
WEIGHTS = torch.tensor([0.0, 1.0, 1.0, 0.5, 1.0], dtype=torch.float64)


def value_and_grad(name: str, config: dict[str, float] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    spec, cfg = get_loss(name, config)
    lp = LP.clone().requires_grad_(True)
    inputs = {"weights": WEIGHTS, "logprobs": SAMPLING, "advantages": ADV}
    per_token = spec.fn(lp, inputs, cfg)
    per_token.sum().backward()
    assert lp.grad is not None
    return per_token.detach(), lp.grad


def test_cross_entropy() -> None:
    loss, grad = value_and_grad("cross_entropy")
    torch.testing.assert_close(loss, -LP * WEIGHTS)
    torch.testing.assert_close(grad, -WEIGHTS)


def test_importance_sampling() -> None:
    ratio = torch.exp(LP - SAMPLING)
    loss, grad = value_and_grad("importance_sampling")
    torch.testing.assert_close(loss, -ratio * ADV)
    torch.testing.assert_close(grad, -ratio * ADV)  # d/dlp exp(lp - s) = exp(lp - s)


@pytest.mark.parametrize(("low", "high"), [(0.8, 1.2), (0.5, 1.5)])
def test_ppo_clips(low: float, high: float) -> None:
    ratio = torch.exp(LP - SAMPLING)
    clipped = ratio.clamp(low, high)
    expected = -torch.minimum(ratio * ADV, clipped * ADV)
    # gradient flows only where the unclipped term is the minimum
    unclipped_active = (ratio * ADV) <= (clipped * ADV)
    expected_grad = torch.where(unclipped_active, -ratio * ADV, torch.zeros_like(ratio))
    loss, grad = value_and_grad("ppo", {"clip_low_threshold": low, "clip_high_threshold": high})
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(grad, expected_grad)
    if (low, high) == (0.8, 1.2):
        # token 1: ratio e^-0.8 = 0.45 < 0.8 with A < 0 -> clipped, no gradient; token 3 likewise above 1.2
        assert grad[1] == 0 and grad[3] == 0
        assert loss[3] == pytest.approx(-1.2 * 2.0)


def test_cispo() -> None:
    clipped = torch.exp(LP - SAMPLING).clamp(0.8, 1.2)
    loss, grad = value_and_grad("cispo")
    torch.testing.assert_close(loss, -clipped * LP * ADV)
    torch.testing.assert_close(grad, -clipped * ADV)  # the clipped ratio is not differentiated


def test_dro() -> None:
    beta = 0.3
    loss, grad = value_and_grad("dro", {"beta": beta})
    torch.testing.assert_close(loss, -(LP * ADV - 0.5 * beta * (LP - SAMPLING) ** 2))
    torch.testing.assert_close(grad, -(ADV - beta * (LP - SAMPLING)))


def test_per_token_clip_inputs_override_config() -> None:
    spec, cfg = get_loss("ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2})
    lp = LP.clone()
    wide = torch.full_like(LP, 100.0)
    inputs = {
        "logprobs": SAMPLING,
        "advantages": ADV,
        "clip_low_threshold": 1 / wide,
        "clip_high_threshold": wide,
    }
    ratio = torch.exp(LP - SAMPLING)
    torch.testing.assert_close(spec.fn(lp, inputs, cfg), -ratio * ADV)


def test_bad_names_and_config_are_clear() -> None:
    with pytest.raises(ValueError, match="unknown loss_fn 'nope'"):
        get_loss("nope", None)
    with pytest.raises(ValueError, match="'beta' is not used by 'ppo'"):
        get_loss("ppo", {"beta": 0.1})
    with pytest.raises(ValueError, match="must be a number"):
        get_loss("dro", {"beta": "x"})
    assert set(LOSSES) == {"cross_entropy", "importance_sampling", "ppo", "cispo", "dro"}
