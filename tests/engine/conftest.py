"""Fixtures for the local engine tests: a ServiceClient on a temporary folder, Datum builders."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from tinker import types

from tinkertrace.engine import ServiceClient
from tinkertrace.models.tokenizer import BUILTIN_MODEL, load_tokenizer

NANO = f"{BUILTIN_MODEL}:nano"

TEXTS = (
    "<|im_start|>user\nadd 2 and 3<|im_end|>\n<|im_start|>assistant\n5<|im_end|>\n",
    "<|im_start|>user\nsay hi<|im_end|>\n<|im_start|>assistant\nhi there<|im_end|>\n",
    "<|im_start|>user\ncolor?<|im_end|>\n<|im_start|>assistant\nblue<|im_end|>\n",
)


@pytest.fixture
def service(tmp_path: Path) -> ServiceClient:
    return ServiceClient(tmp_path / "engine", device="cpu", cpu_threads=1)


@pytest.fixture
def kit() -> type[Kit]:
    """Datum builders and fixed sequences (tests import nothing from conftest directly)."""
    return Kit


def sequences() -> list[list[int]]:
    """Token ids of the fixed chat texts."""
    tok = load_tokenizer(BUILTIN_MODEL)
    return [tok.encode(t, add_special_tokens=False) for t in TEXTS]


def ce_datum(tokens: Sequence[int], weights: Sequence[float] | None = None) -> types.Datum:
    """A cross-entropy Datum (shift by one); weight 1 everywhere unless given."""
    n = len(tokens) - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(list(tokens[:-1])),
        loss_fn_inputs={
            "target_tokens": np.asarray(tokens[1:], dtype=np.int64),
            "weights": np.ones(n, np.float32) if weights is None else np.asarray(weights, np.float32),
        },
    )


def rl_datum(tokens: Sequence[int], logprobs: Sequence[float], advantages: Sequence[float]) -> types.Datum:
    """An RL Datum with sampling logprobs and advantages (one value per target token)."""
    return types.Datum(
        model_input=types.ModelInput.from_ints(list(tokens[:-1])),
        loss_fn_inputs={
            "target_tokens": np.asarray(tokens[1:], dtype=np.int64),
            "logprobs": np.asarray(logprobs, np.float32),
            "advantages": np.asarray(advantages, np.float32),
        },
    )


class Kit:
    """Helpers handed to tests through the ``kit`` fixture."""

    NANO = NANO
    sequences = staticmethod(sequences)
    ce_datum = staticmethod(ce_datum)
    rl_datum = staticmethod(rl_datum)
