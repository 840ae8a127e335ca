"""Off-policy correction of stale samples (decoupled PPO with a truncated importance weight).

Three policies meet in one step of asynchronous RL: the *behaviour* policy that sampled token ``t``
(its logprob ``b_t``, recorded by the sampler), the *proximal* policy (the trainer's weights when the
step starts; ``p_t`` from one extra forward pass) and the learner ``π_θ`` being updated. The
corrected per-token loss (decoupled PPO, as in AReaL) is::

    L_t = -w_t · min(r_t · A_t, clip(r_t, low, high) · A_t),   r_t = exp(logπ_θ(t) - p_t)
    w_t = min(exp(p_t - b_t), C)                                (a constant: no gradient flows into it)

so the trust region is measured against the proximal policy (a stale token is not clipped away only
because the sampler was old) while ``w_t`` corrects the sampling distribution, truncated at ``C``
(``staleness_cap``) so a few tokens the new policy likes far more than the old one cannot dominate.

Tinker's built-in losses express it unchanged on both backends: give the Datum ``logprobs = p`` and
``advantages = w · A`` (:func:`corrected_inputs`); then ``ppo`` computes exactly ``L_t``, and
``importance_sampling`` its unclipped form ``-w_t · r_t · A_t``. :func:`decoupled_ppo_reference` is the
per-token specification the tests hold that construction to.
"""

from __future__ import annotations

import math

import numpy as np

DEFAULT_STALENESS_CAP = 2.0
DEFAULT_CLIP_LOW = 0.8  # Tinker's ppo / cispo clip thresholds (the local engine's defaults too)
DEFAULT_CLIP_HIGH = 1.2
AGE_BUCKETS = 4  # per-age figures for tokens 0, 1, 2, 3 versions old, then "4+"


def age_label(age: int) -> str:
    """A token age's bucket name: ``"0"`` … ``"3"``, then ``"4+"``."""
    return f"{AGE_BUCKETS}+" if age >= AGE_BUCKETS else str(age)


def truncated_weights(proximal: np.ndarray, behaviour: np.ndarray, cap: float) -> np.ndarray:
    """``w = min(exp(proximal - behaviour), cap)`` per token (float64)."""
    diff = np.asarray(proximal, dtype=np.float64) - np.asarray(behaviour, dtype=np.float64)
    return np.minimum(np.exp(np.minimum(diff, math.log(cap))), cap)


def corrected_inputs(
    proximal: np.ndarray, behaviour: np.ndarray, advantages: np.ndarray, mask: np.ndarray, cap: float
) -> tuple[np.ndarray, np.ndarray]:
    """A Datum's corrected ``(logprobs, advantages)`` (float32): the proximal logprob and ``w · A`` on
    trained tokens (``mask`` > 0), 0 and the unchanged advantage (0 there) elsewhere."""
    trained = np.asarray(mask) > 0
    weights = np.where(trained, truncated_weights(proximal, behaviour, cap), 1.0)
    logprobs = np.where(trained, proximal, 0.0).astype(np.float32)
    return logprobs, (np.asarray(advantages, dtype=np.float64) * weights).astype(np.float32)


def decoupled_ppo_reference(
    learner: list[float],
    proximal: list[float],
    behaviour: list[float],
    advantages: list[float],
    *,
    cap: float,
    low: float,
    high: float,
) -> tuple[list[float], list[float]]:
    """The specification, one token at a time: each token's loss ``L_t`` (module docstring) and its
    derivative with respect to the learner's logprob."""
    losses, grads = [], []
    for lp, prox, behav, adv in zip(learner, proximal, behaviour, advantages, strict=True):
        weight = min(math.exp(prox - behav), cap)
        ratio = math.exp(lp - prox)
        unclipped, clipped = ratio * adv, min(max(ratio, low), high) * adv
        losses.append(-weight * min(unclipped, clipped))
        grads.append(-weight * ratio * adv if unclipped <= clipped else 0.0)  # d ratio / d lp = ratio
    return losses, grads


def mismatch_metrics(
    behaviour: list[np.ndarray],
    proximal: list[np.ndarray],
    masks: list[np.ndarray],
    cap: float | None,
    ages: list[np.ndarray] | None = None,
) -> dict[str, float]:
    """How far the sampler's logprobs are from the trainer's on the trained tokens.

    ``offpolicy/mismatch_kl``: the k3 estimate of KL(behaviour ‖ proximal), ``mean(ρ - 1 - log ρ)``
    with ``ρ = exp(p - b)`` (≥ 0, 0 when on-policy); ``offpolicy/ratio_mean`` and ``ratio_max`` of
    ``ρ``; with a ``cap``, ``offpolicy/truncated_frac``: the share of tokens whose ``ρ`` exceeded it.

    With ``ages`` (per Datum, each target token's age in policy versions, aligned with ``masks``) the
    same estimate per age, ``offpolicy/mismatch_kl_age_{0,1,2,3,4+}`` (ages with no trained token left
    out): age 0 is the sampler/trainer mismatch of the same weights (rounding, a different forward
    pass); age ``k`` adds the drift of the trainer's last ``k`` updates, so an asynchronous run's
    overall figure is mostly the size of its recent steps.
    """
    if not masks:
        return {}
    mask = np.concatenate(masks) > 0
    if not mask.any():
        return {}
    log_ratio = (
        np.concatenate(proximal).astype(np.float64)[mask] - np.concatenate(behaviour).astype(np.float64)[mask]
    )
    ratio = np.exp(log_ratio)
    kl = ratio - 1.0 - log_ratio
    metrics = {
        "offpolicy/mismatch_kl": float(np.mean(kl)),
        "offpolicy/ratio_mean": float(ratio.mean()),
        "offpolicy/ratio_max": float(ratio.max()),
    }
    if cap is not None:
        metrics["offpolicy/truncated_frac"] = float(np.mean(ratio > cap))
    if ages is not None:
        bucket = np.clip(np.concatenate(ages).astype(np.int64)[mask], 0, AGE_BUCKETS)
        counts = np.bincount(bucket, minlength=AGE_BUCKETS + 1)
        sums = np.bincount(bucket, weights=kl, minlength=AGE_BUCKETS + 1)
        for age in np.flatnonzero(counts):
            metrics[f"offpolicy/mismatch_kl_age_{age_label(int(age))}"] = float(sums[age] / counts[age])
    return metrics


def clipped_fraction(
    learner: list[np.ndarray], reference: list[np.ndarray], masks: list[np.ndarray], low: float, high: float
) -> float:
    """Share of trained tokens whose ratio ``exp(learner - reference)`` lies outside ``[low, high]``
    (where PPO's clip takes the gradient away)."""
    mask = np.concatenate(masks) > 0 if masks else np.zeros(0, bool)
    if not mask.any():
        return 0.0
    ratio = np.exp(np.concatenate(learner)[mask].astype(np.float64) - np.concatenate(reference)[mask])
    return float(np.mean((ratio < low) | (ratio > high)))
