"""Datum alignment against hand-computed cases (shift by one, observation tokens, truncation)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tinkertrace.training.datums import build_datums

# One two-turn row: prompt [1, 2], action [3, 4], observation [5], action [6].
TOKENS = [1, 2, 3, 4, 5, 6]
MASK = [0, 0, 1, 1, 0, 1]
LOGPROBS = [-9.0, -9.0, -0.5, -0.25, -9.0, -1.0]  # junk on observation tokens must become 0


def _cols(rows: list[tuple[list[int], list[float], list[int]]]) -> tuple[pa.Array, pa.Array, pa.Array]:
    return (
        pa.array([r[0] for r in rows], pa.list_(pa.int32())),
        pa.array([r[1] for r in rows], pa.list_(pa.float32())),
        pa.array([r[2] for r in rows], pa.list_(pa.int8())),
    )


def _inputs(batch, i: int, key: str) -> list[float]:
    return batch.data[i].loss_fn_inputs[key].to_numpy().tolist()


def test_multi_turn_row_is_shifted_by_one_with_zero_advantage_on_observations() -> None:
    batch = build_datums(*_cols([(TOKENS, LOGPROBS, MASK)]), np.array([2.0]))
    assert len(batch.data) == 1
    datum = batch.data[0]
    assert datum.model_input.to_ints() == [1, 2, 3, 4, 5]
    assert _inputs(batch, 0, "target_tokens") == [2, 3, 4, 5, 6]
    assert _inputs(batch, 0, "logprobs") == [0.0, -0.5, -0.25, 0.0, -1.0]
    assert _inputs(batch, 0, "advantages") == [0.0, 2.0, 2.0, 0.0, 2.0]
    assert set(datum.loss_fn_inputs) == {"target_tokens", "logprobs", "advantages"}  # no mask sent
    assert batch.masks[0].tolist() == [0.0, 1.0, 1.0, 0.0, 1.0]
    assert batch.sampling_logprobs[0].tolist() == [0.0, -0.5, -0.25, 0.0, -1.0]
    assert datum.loss_fn_inputs["target_tokens"].dtype == "int64"
    assert batch.num_tokens == 5 and batch.num_action_tokens == 3


def test_rows_keep_their_own_advantage_and_source_index() -> None:
    rows = [([7, 8, 9], [0.0, 0.0, -0.1], [0, 0, 1]), (TOKENS, LOGPROBS, MASK)]
    batch = build_datums(*_cols(rows), np.array([-1.5, 0.5]))
    assert batch.row_index.tolist() == [0, 1]
    assert _inputs(batch, 0, "advantages") == [0.0, -1.5]
    assert _inputs(batch, 1, "advantages") == [0.0, 0.5, 0.5, 0.0, 0.5]


def test_cross_entropy_gets_the_mask_as_weights() -> None:
    batch = build_datums(*_cols([(TOKENS, LOGPROBS, MASK)]), np.array([1.0]), loss_fn="cross_entropy")
    assert set(batch.data[0].loss_fn_inputs) == {"target_tokens", "weights"}
    assert _inputs(batch, 0, "weights") == [0.0, 1.0, 1.0, 0.0, 1.0]


def test_truncation_keeps_the_head_and_counts_what_was_cut() -> None:
    batch = build_datums(*_cols([(TOKENS, LOGPROBS, MASK)]), np.array([1.0]), max_tokens=3)
    assert batch.data[0].model_input.to_ints() == [1, 2, 3]
    assert _inputs(batch, 0, "target_tokens") == [2, 3, 4]
    assert _inputs(batch, 0, "advantages") == [0.0, 1.0, 1.0]
    assert (batch.truncated_rows, batch.tokens_cut, batch.dropped_rows) == (1, 2, 0)


def test_rows_without_a_sampled_target_are_dropped_and_counted() -> None:
    rows = [
        ([1, 2, 3], [0.0, 0.0, -0.3], [0, 0, 1]),  # the only action is cut by max_tokens=1
        ([4], [0.0], [1]),  # one token: nothing to predict
        ([5, 6], [0.0, -0.2], [0, 1]),  # fits exactly
    ]
    batch = build_datums(*_cols(rows), np.array([1.0, 1.0, 1.0]), max_tokens=1)
    assert batch.row_index.tolist() == [2]
    assert batch.dropped_rows == 2
    assert _inputs(batch, 0, "target_tokens") == [6]


def test_chunked_and_sliced_columns_align_like_plain_ones() -> None:
    tokens, logprobs, mask = _cols([([9, 9, 9], [0.0, 0.0, 0.0], [0, 0, 1]), (TOKENS, LOGPROBS, MASK)])
    chunked = [pa.chunked_array([c.slice(1)]) for c in (tokens, logprobs, mask)]
    batch = build_datums(*chunked, np.array([2.0]))
    assert _inputs(batch, 0, "target_tokens") == [2, 3, 4, 5, 6]


def test_length_mismatch_and_unknown_loss_are_rejected() -> None:
    tokens, logprobs, mask = _cols([(TOKENS, LOGPROBS, MASK)])
    short = pa.array([LOGPROBS[:-1]], pa.list_(pa.float32()))
    with pytest.raises(ValueError, match="different lengths"):
        build_datums(tokens, short, mask, np.array([1.0]))
    with pytest.raises(ValueError, match="unknown loss"):
        build_datums(tokens, logprobs, mask, np.array([1.0]), loss_fn="mse")
