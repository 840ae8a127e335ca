"""How old each trained token is, and what follow mode does about it.

* :func:`token_policy_versions` — the one place per-token policy versions are read: the builder's
  ``response_policy_versions`` column when it is there (one version per sampled token, in order), else
  each row's ``policy_version`` repeated over its sampled tokens.
* :func:`row_ages` — each row's age in versions at a step: the age of its oldest (or newest) token.
* :func:`rollout_ages` — each row's rollout's age: its oldest (or newest) token over all the
  rollout's rows (segments).
* :func:`stale_rows` — the rows over ``max_staleness``: rollout by rollout by the oldest token
  (``drop``), or whole groups with nothing left to train (``correct``: the bound is per token,
  :func:`correct_batch` masks what is over it, and a rollout wholly over the bound stays in its
  group's advantages, the baseline of the rest).
* :func:`staleness_metrics` — the step's staleness histograms (tokens and rollouts) and how many
  rollouts carried more than one policy version.
* :func:`target_ages` — each trained token's age, aligned with a batch's Datums (the mismatch KL by
  age: age 0 is the pure sampler/trainer mismatch, age 1 adds the trainer's last update).
* :func:`correct_batch` — the ``correct`` mode's Datums: one forward pass for the proximal logprobs,
  then :func:`~tinkertrace.training.offpolicy.corrected_inputs` (formula in
  :mod:`tinkertrace.training.offpolicy`); a token older than the bound gets no advantage (a long
  episode whose first turns are over the bound trains its later ones).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tinker import types

from tinkertrace.training.datums import DatumBatch
from tinkertrace.training.offpolicy import AGE_BUCKETS, age_label, corrected_inputs, mismatch_metrics

VERSIONS_COLUMN = "response_policy_versions"
NEVER = np.iinfo(np.int64).max


def _action_counts(table: pa.Table) -> np.ndarray:
    """Sampled (action) tokens per row."""
    mask = table["action_mask"].combine_chunks()
    offsets = np.asarray(mask.offsets, dtype=np.int64)
    flat = np.concatenate([[0], np.cumsum(mask.flatten().to_numpy(zero_copy_only=False) > 0)])
    return flat[offsets[1:] - offsets[0]] - flat[offsets[:-1] - offsets[0]]


def token_policy_versions(table: pa.Table) -> pa.ListArray:
    """Per row, the policy version of each sampled token (``list<int64>``; null where unknown)."""
    counts = _action_counts(table)
    version = table["policy_version"].combine_chunks()
    fallback = np.repeat(pc.fill_null(version, -1).to_numpy(zero_copy_only=False), counts)
    values = fallback.astype(np.int64)
    if VERSIONS_COLUMN in table.column_names:
        per_token = table[VERSIONS_COLUMN].combine_chunks()
        fits = pc.and_kleene(pc.is_valid(per_token), pc.equal(pc.list_value_length(per_token), counts))
        fits_np = np.asarray(pc.fill_null(fits, False).to_numpy(zero_copy_only=False), dtype=bool)
        given = pc.fill_null(pc.list_flatten(per_token.filter(fits)), -1).to_numpy(zero_copy_only=False)
        values[np.repeat(fits_np, counts)] = given
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int64(), mask=values < 0))


def row_ages(table: pa.Table, step: int, newest: bool = False) -> np.ndarray:
    """Each row's age at ``step`` in versions: its oldest token's, or with ``newest`` its newest
    token's (a row with no known version: 0)."""
    versions = token_policy_versions(table)
    flat = pc.fill_null(versions.flatten(), NEVER).to_numpy(zero_copy_only=False).astype(np.int64)
    lengths = np.diff(np.asarray(versions.offsets, dtype=np.int64)).astype(np.int64)
    row = pc.fill_null(table["policy_version"], NEVER).to_numpy(zero_copy_only=False).astype(np.int64)
    picked = row.copy()
    has = lengths > 0
    if has.any():
        starts = np.asarray(versions.offsets)[:-1][has]
        if newest:
            latest = np.maximum.reduceat(np.where(flat == NEVER, -1, flat), starts)
            picked[has] = np.where(latest < 0, row[has], latest)
        else:
            picked[has] = np.minimum(np.minimum.reduceat(flat, starts), row[has])
    return np.where(picked == NEVER, 0, step - np.minimum(picked, step))


def rollout_ages(table: pa.Table, step: int, newest: bool = False) -> np.ndarray:
    """Per row, its rollout's age at ``step``: the oldest token of all the rollout's rows (a rollout
    built as several segments is as old as its first turn in every one of them), or with ``newest``
    its newest token's (the age of its last turn)."""
    ages = pa.table({"rollout_id": table["rollout_id"], "age": row_ages(table, step, newest)})
    how = "min" if newest else "max"
    per_rollout = ages.group_by("rollout_id").aggregate([("age", how)])
    where = pc.index_in(table["rollout_id"], value_set=per_rollout["rollout_id"])
    return np.asarray(per_rollout[f"age_{how}"].take(where).to_numpy(zero_copy_only=False), dtype=np.int64)


def stale_rows(
    table: pa.Table, keys: pa.Array, step: int, bound: int, mode: str, stale_groups: set[str]
) -> np.ndarray:
    """Rows over ``bound`` versions old at ``step``, whole rollouts at a time (a rollout's segments are
    never split across the bound). In ``drop`` mode a rollout is over when its oldest token is. In
    ``correct`` mode the bound is per token (:func:`correct_batch` trains none older) and a group's
    advantages are taken over all of it: a rollout wholly over the bound stays for its group's
    baseline (the follow trainer drops it after), and only a group with nothing left to train —
    every rollout of it here over the bound by its newest token — goes (and
    every group in ``stale_groups``, where the keys found here are added): later rollouts of a group
    dropped before cannot train alone."""
    if mode != "correct":
        return rollout_ages(table, step) > bound
    over = pa.table({"key": keys, "over": rollout_ages(table, step, newest=True) > bound})
    spent = over.group_by("key").aggregate([("over", "all")]).filter(pc.field("over_all"))
    stale_groups.update(k for k in spent["key"].to_pylist() if k is not None)
    if not stale_groups:
        return np.zeros(table.num_rows, dtype=bool)
    member = pc.is_in(keys, value_set=pa.array(sorted(stale_groups), keys.type))
    return np.asarray(pc.fill_null(member, False).to_numpy(zero_copy_only=False), dtype=bool)


def staleness_metrics(table: pa.Table, step: int) -> dict[str, Any]:
    """The staleness histograms of a step's trained rows — ``offpolicy/token_age_{0..3,4+}`` (sampled
    tokens) and ``offpolicy/rollout_age_…`` (rollouts, by their oldest token) — and
    ``offpolicy/multi_version_rollouts``: rollouts whose tokens came from more than one version."""
    versions = token_policy_versions(table)
    lengths = np.diff(np.asarray(versions.offsets, dtype=np.int64)).astype(np.int64)
    flat = pc.fill_null(versions.flatten(), step).to_numpy(zero_copy_only=False).astype(np.int64)
    per_token = pa.table(
        {
            "rollout_id": pc.take(table["rollout_id"], pa.array(np.repeat(np.arange(len(lengths)), lengths))),
            "v": flat,
        }
    )
    per_rollout = per_token.group_by("rollout_id").aggregate([("v", "min"), ("v", "max")])
    token_age = step - flat
    rollout_age = step - per_rollout["v_min"].to_numpy()
    metrics: dict[str, Any] = {}
    for name, ages in (("token_age", token_age), ("rollout_age", rollout_age)):
        counts = np.bincount(np.clip(ages, 0, AGE_BUCKETS), minlength=AGE_BUCKETS + 1)
        for age, count in enumerate(counts):
            metrics[f"offpolicy/{name}_{age_label(age)}"] = int(count)
    spread = pc.not_equal(per_rollout["v_min"], per_rollout["v_max"])
    metrics["offpolicy/multi_version_rollouts"] = int(pc.sum(spread).as_py() or 0)
    metrics["offpolicy/token_age_mean"] = float(token_age.mean()) if len(token_age) else 0.0
    return metrics


def target_ages(table: pa.Table, batch: DatumBatch, step: int) -> list[np.ndarray]:
    """Per Datum of ``batch`` (built from the rows of ``table``), each target token's age at ``step`` in
    versions, aligned with ``batch.masks``: for :func:`~tinkertrace.training.offpolicy.mismatch_metrics`
    by age (0 where the target is no sampled token or its version is unknown)."""
    versions = pc.fill_null(token_policy_versions(table).flatten(), step).to_numpy(zero_copy_only=False)
    mask = table["action_mask"].combine_chunks()
    offsets = np.asarray(mask.offsets, dtype=np.int64)
    action = mask.flatten().to_numpy(zero_copy_only=False) > 0
    ages = np.zeros(len(action), dtype=np.int64)
    ages[action] = step - np.asarray(versions, dtype=np.int64)
    starts = offsets[:-1] - offsets[0] + 1  # a Datum's targets are its row's tokens from the second on
    return [ages[starts[i] : starts[i] + len(m)] for i, m in zip(batch.row_index, batch.masks, strict=True)]


def correct_batch(
    client: Any,
    batch: DatumBatch,
    loss_fn: str,
    cap: float,
    ages: list[np.ndarray] | None = None,
    bound: int | None = None,
) -> dict[str, float]:
    """Rewrite ``batch``'s Datums for the corrected loss: the trainer's current logprobs (one
    ``forward``, the proximal policy) as ``logprobs`` and ``w · A`` as ``advantages``, where a
    token more than ``bound`` versions old (by ``ages``) gets advantage 0; the sampler's logprobs
    stay in ``batch.sampling_logprobs``. Returns the mismatch metrics of the trained tokens (by token
    age too, given each target token's ``ages``) and ``offpolicy/over_bound_frac``, the share of
    sampled tokens masked."""
    if not batch.data:
        return {}
    output = client.forward(batch.data, loss_fn).result()
    proximal = [out["logprobs"].to_numpy() for out in output.loss_fn_outputs]
    trained = list(batch.masks)  # the tokens within the bound: the mismatch figures are theirs
    for j, datum in enumerate(batch.data):
        inputs = datum.loss_fn_inputs
        advantages = inputs["advantages"].to_numpy()
        if ages is not None and bound is not None:
            over = (ages[j] > bound) & (batch.masks[j] > 0)
            advantages = np.where(over, 0.0, advantages).astype(advantages.dtype)
            trained[j] = np.where(over, 0, batch.masks[j])
        logprobs, advantages = corrected_inputs(
            proximal[j], batch.sampling_logprobs[j], advantages, batch.masks[j], cap
        )
        batch.data[j] = types.Datum(
            model_input=datum.model_input,
            loss_fn_inputs={
                **inputs,
                "logprobs": types.TensorData.from_numpy(logprobs),
                "advantages": types.TensorData.from_numpy(advantages),
            },
        )
    metrics = mismatch_metrics(batch.sampling_logprobs, proximal, trained, cap, ages)
    sampled = sum(int((m > 0).sum()) for m in batch.masks)
    masked = sampled - sum(int((m > 0).sum()) for m in trained)
    return {**metrics, "offpolicy/over_bound_frac": masked / max(sampled, 1)}
