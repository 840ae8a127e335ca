"""Datums as tensors: padded to one batch, and split into microbatches of rows of similar length that
fit a token budget.

A forward pass costs what its padded tokens cost (rows × its longest row), plus a fixed overhead. A
batch of multi-turn episodes mixes rows of a few dozen tokens with rows of many hundred, so one pass
over all of them is mostly padding. :func:`microbatches` takes the rows by length and starts a new
pass where the padding a row would add to the current one costs more than a pass
(:data:`PASS_TOKENS`, by device); each pass is cut to its own longest row. The losses are sums over
tokens, so how rows are split and ordered changes only the float rounding, and outputs come back in
the Datums' order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tinker import types

from tinkertrace.engine.losses import LossSpec
from tinkertrace.engine.sampling import prompt_tokens

MICROBATCH_TOKENS = 32768
"""Padded tokens per forward pass; larger batches run as several passes (gradients add up)."""
PASS_TOKENS = {"cpu": 128, "cuda": 2048}
"""Per device type, what one more forward pass costs, counted in padded tokens. On the 2-core VM a
pass of the built-in model costs what ~100 tokens do, and 128 gave the fastest steps of 128, 512 and
2048 (``benchmarks/length_grouping.py``); on a GPU a pass costs more tokens' worth (2048: chosen,
not yet measured). Other devices take the CUDA figure."""


@dataclass
class Batch:
    """Datums padded to one [B, T] batch; ``valid`` marks real (unpadded) positions."""

    input_ids: torch.Tensor
    valid: torch.Tensor
    lengths: list[int]
    inputs: dict[str, torch.Tensor]


def collate(
    data: Sequence[types.Datum], spec: LossSpec, loss_name: str, vocab_size: int, device: torch.device
) -> Batch:
    """Check each Datum against the loss's inputs and pad them into one batch (ValueError names the datum)."""
    if not data:
        raise ValueError("data is empty: forward/forward_backward need at least one Datum")
    allowed = set(spec.required) | set(spec.optional)
    rows: list[tuple[list[int], dict[str, np.ndarray]]] = []
    for i, datum in enumerate(data):
        if not isinstance(datum, types.Datum):
            raise ValueError(f"data[{i}] is a {type(datum).__name__}, expected tinker.types.Datum")
        tokens = prompt_tokens(datum.model_input)
        keys = set(datum.loss_fn_inputs)
        if missing := sorted(set(spec.required) - keys):
            raise ValueError(f"data[{i}]: loss {loss_name!r} needs loss_fn_inputs {missing}")
        if extra := sorted(keys - allowed):
            raise ValueError(f"data[{i}]: loss {loss_name!r} does not take loss_fn_inputs {extra}")
        arrays = {k: datum.loss_fn_inputs[k].to_numpy() for k in keys}
        for key, arr in arrays.items():
            if arr.shape != (len(tokens),):
                raise ValueError(
                    f"data[{i}]: loss_fn_inputs[{key!r}] has shape {list(arr.shape)}, "
                    f"expected [{len(tokens)}] (one value per model_input token)"
                )
            if arr.dtype.kind == "f" and not np.isfinite(arr).all():
                raise ValueError(f"data[{i}]: loss_fn_inputs[{key!r}] contains NaN or infinity")
        targets = arrays["target_tokens"]
        if targets.min() < 0 or targets.max() >= vocab_size:
            raise ValueError(f"data[{i}]: target_tokens outside the vocabulary [0, {vocab_size})")
        if min(tokens) < 0 or max(tokens) >= vocab_size:
            raise ValueError(f"data[{i}]: model_input tokens outside the vocabulary [0, {vocab_size})")
        rows.append((tokens, arrays))

    lengths = [len(t) for t, _ in rows]
    batch, width = len(rows), max(lengths)
    ids = np.zeros((batch, width), dtype=np.int64)
    valid = np.zeros((batch, width), dtype=bool)
    inputs = {
        k: np.zeros((batch, width), dtype=np.int64 if k == "target_tokens" else np.float32)
        for k in rows[0][1]
    }
    for r, (tokens, arrays) in enumerate(rows):
        ids[r, : len(tokens)] = tokens
        valid[r, : len(tokens)] = True
        for key, arr in arrays.items():
            inputs[key][r, : len(tokens)] = arr
    return Batch(
        input_ids=torch.from_numpy(ids).to(device),
        valid=torch.from_numpy(valid).to(device),
        lengths=lengths,
        inputs={k: torch.from_numpy(v).to(device) for k, v in inputs.items()},
    )


def microbatches(
    lengths: Sequence[int], budget: int = MICROBATCH_TOKENS, pass_tokens: int = PASS_TOKENS["cpu"]
) -> list[np.ndarray]:
    """The row indices of each forward pass. Rows go shortest first (ties in order); a row starts a new
    pass when the pass would exceed ``budget`` padded tokens with it, or when the padding it adds
    (every row so far grown to its length) is over ``pass_tokens``."""
    passes: list[list[int]] = []
    longest = 0  # of the current pass: its last row, as rows go shortest first
    for row in np.argsort(np.asarray(lengths), kind="stable").tolist():
        n = lengths[row]
        if passes and (len(passes[-1]) + 1) * n <= budget and len(passes[-1]) * (n - longest) <= pass_tokens:
            passes[-1].append(row)
        else:
            passes.append([row])
        longest = n
    return [np.asarray(rows, dtype=np.int64) for rows in passes]
