"""Tinker's built-in losses as pure torch functions, following Tinker's documented definitions.

Each loss maps the learner's per-token log-probabilities of the target tokens (``target_logprobs``)
and the Datum's ``loss_fn_inputs`` to an elementwise (per-token) loss; the engine sums them
(Tinker's losses are sums over tokens, not means). With ``ratio = exp(target_logprobs - logprobs)``
where ``logprobs`` are the sampler's log-probabilities:

- ``cross_entropy``: ``-target_logprobs * weights``
- ``importance_sampling``: ``-ratio * advantages``
- ``ppo``: ``-min(ratio * A, clip(ratio, low, high) * A)``
- ``cispo``: ``-sg(clip(ratio, low, high)) * target_logprobs * A``
- ``dro``: ``-(target_logprobs * A - 0.5 * beta * (target_logprobs - logprobs) ** 2)``
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from tinkertrace.training.offpolicy import DEFAULT_CLIP_HIGH, DEFAULT_CLIP_LOW

DEFAULT_DRO_BETA = 0.05

Inputs = Mapping[str, torch.Tensor]
Config = Mapping[str, float]


def _ratio(target_logprobs: torch.Tensor, inputs: Inputs) -> torch.Tensor:
    return torch.exp(target_logprobs - inputs["logprobs"])


def _clip_bounds(inputs: Inputs, config: Config) -> tuple[torch.Tensor | float, torch.Tensor | float]:
    """Clip thresholds: per-token inputs when the Datum carries them, else the loss config."""
    low = inputs.get("clip_low_threshold", config.get("clip_low_threshold", DEFAULT_CLIP_LOW))
    high = inputs.get("clip_high_threshold", config.get("clip_high_threshold", DEFAULT_CLIP_HIGH))
    return low, high


def _clamp(x: torch.Tensor, low: torch.Tensor | float, high: torch.Tensor | float) -> torch.Tensor:
    low_t = torch.as_tensor(low, dtype=x.dtype, device=x.device)
    high_t = torch.as_tensor(high, dtype=x.dtype, device=x.device)
    return torch.minimum(torch.maximum(x, low_t), high_t)


def cross_entropy(target_logprobs: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    """Weighted negative log-likelihood per token."""
    return -target_logprobs * inputs["weights"]


def importance_sampling(target_logprobs: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    """REINFORCE with an importance ratio against the sampler: ``-ratio * A``."""
    return -_ratio(target_logprobs, inputs) * inputs["advantages"]


def ppo(target_logprobs: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    """PPO's clipped surrogate, token-wise: ``-min(ratio * A, clip(ratio) * A)``."""
    ratio = _ratio(target_logprobs, inputs)
    advantages = inputs["advantages"]
    clipped = _clamp(ratio, *_clip_bounds(inputs, config))
    return -torch.minimum(ratio * advantages, clipped * advantages)


def cispo(target_logprobs: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    """CISPO: the clipped ratio (no gradient) weights the log-probability: ``-sg(clip(r)) * logp * A``."""
    clipped = _clamp(_ratio(target_logprobs, inputs), *_clip_bounds(inputs, config)).detach()
    return -clipped * target_logprobs * inputs["advantages"]


def dro(target_logprobs: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    """DRO: ``-(logp * A - 0.5 * beta * (logp - sampling_logp)^2)``."""
    beta = float(config.get("beta", DEFAULT_DRO_BETA))
    quadratic = (target_logprobs - inputs["logprobs"]) ** 2
    return -(target_logprobs * inputs["advantages"] - 0.5 * beta * quadratic)


@dataclass(frozen=True)
class LossSpec:
    """A built-in loss: its function, required and optional Datum inputs, and config keys."""

    fn: Callable[[torch.Tensor, Inputs, Config], torch.Tensor]
    required: tuple[str, ...]
    optional: tuple[str, ...] = ()
    config_keys: tuple[str, ...] = ()


_CLIP_KEYS = ("clip_low_threshold", "clip_high_threshold")
_RL_INPUTS = ("target_tokens", "logprobs", "advantages")

LOSSES: dict[str, LossSpec] = {
    "cross_entropy": LossSpec(cross_entropy, ("target_tokens", "weights")),
    "importance_sampling": LossSpec(importance_sampling, _RL_INPUTS),
    "ppo": LossSpec(ppo, _RL_INPUTS, _CLIP_KEYS, _CLIP_KEYS),
    "cispo": LossSpec(cispo, _RL_INPUTS, _CLIP_KEYS, _CLIP_KEYS),
    "dro": LossSpec(dro, _RL_INPUTS, (), ("beta",)),
}


def get_loss(name: str, config: Mapping[str, float | str] | None) -> tuple[LossSpec, dict[str, float]]:
    """Look up a loss and validate its config; raise ValueError naming what is wrong."""
    spec = LOSSES.get(name)
    if spec is None:
        raise ValueError(f"unknown loss_fn {name!r}; the local engine supports {sorted(LOSSES)}")
    checked: dict[str, float] = {}
    for key, value in (config or {}).items():
        if key not in spec.config_keys:
            raise ValueError(
                f"loss_fn_config key {key!r} is not used by {name!r} (accepted: {list(spec.config_keys)})"
            )
        try:
            checked[key] = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"loss_fn_config[{key!r}] must be a number, got {value!r}") from None
    return spec, checked
