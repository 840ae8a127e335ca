"""``emit_reward``: a rollout's rewards, each a ``gen_ai.evaluation.result`` span."""

from __future__ import annotations

import json
import math
import numbers
import warnings
from collections.abc import Mapping
from typing import Any

from tinkertrace import semconv
from tinkertrace.sdk import runtime
from tinkertrace.sdk.context import ROLLOUT
from tinkertrace.sdk.spans import start_span


def _number(value: Any, what: str) -> float:
    """A real number (Python or numpy scalar: ``numbers.Real`` includes ``np.float32``, ``np.int64``)
    as a float; ValueError for anything else (strings, None, arrays)."""
    if not isinstance(value, numbers.Real):
        raise ValueError(f"{what} must be a number or a mapping of numbers, got {type(value).__name__}")
    return float(value)


def _reward_dimensions(value: Any, name: str, primary: str | None) -> tuple[str, dict[str, float]]:
    """``(primary name, {name: value})`` from a scalar or a mapping; ValueError if not numeric."""
    if isinstance(value, Mapping):
        if not value:
            raise ValueError("reward mapping is empty")
        dims = {str(k): _number(v, f"reward {k!r}") for k, v in value.items()}
        chosen = primary or (name if name in dims else next(iter(dims)))
        if chosen not in dims:
            raise ValueError(f"primary reward {chosen!r} is not one of {sorted(dims)}")
    else:
        chosen, dims = name, {name: _number(value, "reward")}
    bad = [k for k, v in dims.items() if not math.isfinite(v)]
    if bad:
        raise ValueError(f"reward dimension(s) {bad} are not finite")
    return chosen, dims


def reward_attributes(
    value: float | Mapping[str, float],
    name: str = semconv.PRIMARY_REWARD,
    *,
    primary: str | None = None,
    response_id: str | None = None,
    final: bool = False,
) -> dict[str, Any]:
    """A reward span's attributes (see :func:`emit_reward`); ValueError if ``value`` is not numeric.
    The sampling endpoint's reward route writes the same span from these."""
    chosen, dims = _reward_dimensions(value, name, primary)
    attributes: dict[str, Any] = {
        semconv.GENAI_EVALUATION_NAME: chosen,
        semconv.GENAI_EVALUATION_SCORE: dims[chosen],
        semconv.REWARD_NAME: chosen,
        semconv.REWARD_VALUE: dims[chosen],
        semconv.REWARD_DIMENSIONS: json.dumps(dims, sort_keys=True),
        semconv.REWARD_FINAL: final,
    }
    if response_id is not None:
        attributes[semconv.GENAI_RESPONSE_ID] = str(response_id)
    return attributes


def emit_reward(
    value: float | Mapping[str, float],
    name: str = semconv.PRIMARY_REWARD,
    *,
    primary: str | None = None,
    response_id: str | None = None,
    final: bool = False,
) -> bool:
    """Record a reward for the current rollout as a ``gen_ai.evaluation.result`` span.

    ``value`` is a number (dimension ``name``) or a mapping of named dimensions, of which
    ``primary`` (default: ``name`` if present, else the first) is the reward used for training.
    ``response_id`` links it to the ``gen_ai.response.id`` of the LLM call it rewards. Outside a
    rollout, or with a value that is not a finite number, it warns and returns False; it never raises.
    """
    try:
        if ROLLOUT.get() is None:
            warnings.warn(
                "tinkertrace.emit_reward() called outside a @traced_rollout; the reward is not recorded",
                RuntimeWarning,
                stacklevel=2,
            )
            return False
        attributes = reward_attributes(value, name, primary=primary, response_id=response_id, final=final)
        start_span(runtime.get(), semconv.REWARD_SPAN_NAME, semconv.TYPE_REWARD, attributes).end()
        return True
    except Exception as exc:
        warnings.warn(f"tinkertrace: reward not recorded: {exc}", RuntimeWarning, stacklevel=2)
        return False
