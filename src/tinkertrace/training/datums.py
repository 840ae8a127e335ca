"""Trajectory rows → ``tinker.types.Datum``, aligned exactly as the Tinker cookbook aligns them.

A trajectory row holds one token sequence (prompt and sampled turns already merged by the builder)
with a sampling logprob and an action-mask value per token. For each row:

- observation tokens (mask 0) get advantage 0 and logprob 0; sampled tokens get the row's advantage;
- ``model_input = tokens[:-1]``, ``target_tokens = tokens[1:]``, and ``logprobs``, ``advantages``
  and the mask are sliced ``[1:]`` so position ``t`` scores the prediction of ``tokens[t + 1]``;
- the mask is not a Tinker loss input: it is kept locally (for the KL metrics), never sent.

Truncation rule: a row longer than ``max_tokens + 1`` tokens keeps its first ``max_tokens + 1``
tokens (so ``model_input`` has at most ``max_tokens`` tokens); the tail is cut, because earlier
tokens stay valid context for a causal model while a cut head would change every later logprob.
A row left with no sampled target token (too short, or every action cut off) gives no Datum and is
counted in ``dropped_rows``.

All per-token work is vectorised over the whole batch with numpy; Python only loops to wrap each
row's slices in a ``Datum``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import get_args

import numpy as np
import pyarrow as pa
from tinker import types

from tinkertrace.training.config import Loss

LOSS_FUNCTIONS: tuple[str, ...] = get_args(Loss)  # declared with the settings (training.config)
ADVANTAGE_LOSSES = tuple(loss for loss in LOSS_FUNCTIONS if loss != "cross_entropy")


@dataclass
class DatumBatch:
    """Datums for one step, with what stays local: masks, sampling logprobs, source rows."""

    data: list[types.Datum] = field(default_factory=list)
    masks: list[np.ndarray] = field(default_factory=list)
    sampling_logprobs: list[np.ndarray] = field(default_factory=list)
    row_index: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    truncated_rows: int = 0
    tokens_cut: int = 0
    dropped_rows: int = 0

    @property
    def num_tokens(self) -> int:
        """Model-input tokens over all datums."""
        return int(sum(d.model_input.length for d in self.data))

    @property
    def num_action_tokens(self) -> int:
        """Sampled (trained) target tokens over all datums."""
        return int(sum(int(m.sum()) for m in self.masks))


def _flat(column: pa.Array | pa.ChunkedArray, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """(flat values, row offsets of length n+1 starting at 0) of a list column."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks else pa.array([], column.type)
    offsets = np.asarray(column.offsets, dtype=np.int64)
    values = column.flatten().to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    return values, offsets - offsets[0]


def build_datums(
    tokens: pa.Array | pa.ChunkedArray,
    logprobs: pa.Array | pa.ChunkedArray,
    action_mask: pa.Array | pa.ChunkedArray,
    advantages: np.ndarray,
    *,
    loss_fn: str = "importance_sampling",
    max_tokens: int | None = None,
) -> DatumBatch:
    """Datums for rows of ``tokens``/``logprobs``/``action_mask`` (list columns) and one advantage per row.

    ``cross_entropy`` gets ``target_tokens`` and ``weights`` (the action mask); the RL losses get
    ``target_tokens``, ``logprobs`` and ``advantages``.
    """
    if loss_fn not in LOSS_FUNCTIONS:
        raise ValueError(f"unknown loss {loss_fn!r}; choose one of {', '.join(LOSS_FUNCTIONS)}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    tok, offsets = _flat(tokens, np.int64)
    lp, lp_offsets = _flat(logprobs, np.float32)
    mask, mask_offsets = _flat(action_mask, np.float32)
    if not (np.array_equal(offsets, lp_offsets) and np.array_equal(offsets, mask_offsets)):
        bad = np.flatnonzero(
            (np.diff(offsets) != np.diff(lp_offsets)) | (np.diff(offsets) != np.diff(mask_offsets))
        )
        raise ValueError(
            f"rows {bad[:10].tolist()} have tokens, logprobs and action_mask of different lengths"
        )
    advantages = np.asarray(advantages, dtype=np.float64)
    starts, lengths = offsets[:-1], np.diff(offsets)
    if len(advantages) != len(lengths):
        raise ValueError(f"{len(advantages)} advantages for {len(lengths)} rows")

    mask = (mask > 0).astype(np.float32)
    lp = np.where(mask > 0, lp, np.float32(0.0)).astype(np.float32)
    adv = (np.repeat(advantages, lengths) * mask).astype(np.float32)

    kept = lengths if max_tokens is None else np.minimum(lengths, max_tokens + 1)
    cumulative = np.concatenate([[0.0], np.cumsum(mask, dtype=np.float64)])
    actions = cumulative[starts + kept] - cumulative[np.minimum(starts + 1, starts + kept)]
    usable = (kept >= 2) & (actions > 0)

    batch = DatumBatch(
        row_index=np.flatnonzero(usable),
        truncated_rows=int(np.count_nonzero(kept < lengths)),
        tokens_cut=int((lengths - kept).sum()),
        dropped_rows=int(np.count_nonzero(~usable)),
    )
    with_advantages = loss_fn in ADVANTAGE_LOSSES
    for i in batch.row_index:
        s, e = int(starts[i]), int(starts[i] + kept[i])
        target_mask = mask[s + 1 : e]
        inputs: dict[str, types.TensorData] = {"target_tokens": types.TensorData.from_numpy(tok[s + 1 : e])}
        if with_advantages:
            inputs["logprobs"] = types.TensorData.from_numpy(lp[s + 1 : e])
            inputs["advantages"] = types.TensorData.from_numpy(adv[s + 1 : e])
        else:
            inputs["weights"] = types.TensorData.from_numpy(target_mask)
        batch.data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tok[s : e - 1].tolist()), loss_fn_inputs=inputs
            )
        )
        batch.masks.append(target_mask)
        batch.sampling_logprobs.append(lp[s + 1 : e])
    return batch
