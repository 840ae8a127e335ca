"""Prefix merging of a rollout's turns into trajectory rows, vectorised over Arrow/numpy arrays.

Within one (rollout, agent), turn *k* joins the row of turn *k-1* when its prompt starts with
turn *k-1*'s prompt + response; the row's tokens are then the last turn's prompt + response, with
``action_mask`` 1 and the sampling logprob on each turn's response tokens (turn *j*'s response sits
at offset ``len(prompt_j)``), 0 elsewhere. Otherwise a new row (``segment``) starts, and
``split_reason`` says where the prompt first differs from the previous prompt + response:

* ``retokenization_drift`` — the same text tokenised differently: after a short stretch (at most
  :data:`DRIFT_WINDOW` tokens on each side, e.g. a reply starting with newlines that BPE merges with
  the template's newline before it, or a word split differently) the previous prompt + response
  continues in the prompt unchanged, or it ends within that stretch;
* ``template_change`` — anything else: the history itself changed (another chat template or system
  prompt, a template dropping past ``<think>`` blocks as Qwen3's does, an edited reply, truncated
  history);
* ``other`` — at the very first token (an unrelated context).

All comparisons are done for every pair of consecutive turns at once with numpy gathers.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tinkertrace import schemas

REASONS = ("template_change", "retokenization_drift", "other")
# Most tokens a re-tokenised stretch of text may take on either side before the sequences agree again.
# Small on purpose: Qwen3's empty thinking block (4 tokens) dropped from the history is a template change.
DRIFT_WINDOW = 3


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(s, s + n)`` for each (s, n), without a Python loop."""
    lengths = lengths.astype(np.int64, copy=False)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(lengths)
    shift = np.repeat(starts.astype(np.int64) - (ends - lengths), lengths)
    return np.arange(total, dtype=np.int64) + shift


class _Lists:
    """A list column as (flat values, start of each row, length of each row, validity)."""

    def __init__(self, column: pa.ChunkedArray | pa.Array) -> None:
        arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        offsets = arr.offsets.to_numpy().astype(np.int64)
        self.values = arr.values.to_numpy(zero_copy_only=False)
        self.starts = offsets[:-1]
        self.lengths = np.diff(offsets)
        self.valid = (
            np.ones(len(arr), dtype=bool)
            if arr.null_count == 0
            else arr.is_valid().to_numpy(zero_copy_only=False)
        )
        self.lengths = np.where(self.valid, self.lengths, 0)


def _group_codes(table: pa.Table) -> np.ndarray:
    """Row i's (rollout, agent) group number, increasing with agent name within a rollout, given
    rows sorted by rollout."""
    rollout = table.column("rollout_id").combine_chunks()
    n = len(rollout)
    change = np.zeros(n, dtype=np.int64)
    if n > 1:
        change[1:] = pc.not_equal(rollout[1:], rollout[:-1]).to_numpy(zero_copy_only=False)
    rollout_code = np.cumsum(change)
    agent = table.column("agent_name").combine_chunks().dictionary_encode(null_encoding="encode")
    # agents in name order, null first (the order of the sorted trajectories file)
    rank = pc.rank(pc.fill_null(agent.dictionary, ""), sort_keys="ascending", tiebreaker="first")
    agent_code = rank.to_numpy().astype(np.int64)[agent.indices.to_numpy(zero_copy_only=False)]
    return rollout_code * (len(agent.dictionary) + 1) + agent_code


def _mismatches(
    va: np.ndarray, sa: np.ndarray, vb: np.ndarray, sb: np.ndarray, m: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Compare ``va[sa[i]:sa[i] + m[i]]`` with ``vb[sb[i]:sb[i] + m[i]]`` for every i at once;
    returns (i, position) of the first difference of each pair that has one."""
    total = int(m.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    dtype = np.int32 if max(len(va), len(vb)) < 2**31 else np.int64
    ends = np.cumsum(m)
    off = ends - m
    idx = np.arange(total, dtype=dtype)
    idx += np.repeat((sa - off).astype(dtype), m)
    a = va[idx]
    idx += np.repeat((sb - sa).astype(dtype), m)
    diff = np.flatnonzero(a != vb[idx])
    if len(diff) == 0:
        return diff, diff
    pair = np.searchsorted(ends, diff, side="right")
    pairs_with, first_at = np.unique(pair, return_index=True)
    return pairs_with, diff[first_at] - off[pairs_with]


def _first_mismatch(prompts: _Lists, responses: _Lists, prev: np.ndarray, cur: np.ndarray) -> np.ndarray:
    """For each pair, the first index where prompt[cur] differs from prompt[prev] + response[prev]
    (or the shorter length when one is a prefix of the other). Compared in two contiguous parts:
    prompt[prev] with the start of prompt[cur], then response[prev] with what follows."""
    p_len, r_len, c_len = prompts.lengths[prev], responses.lengths[prev], prompts.lengths[cur]
    first = np.minimum(p_len + r_len, c_len)
    c_start = prompts.starts[cur]
    # the response part first: a difference inside the prompt part comes earlier and overrides it
    pairs, at = _mismatches(
        responses.values,
        responses.starts[prev],
        prompts.values,
        c_start + p_len,
        np.clip(c_len - p_len, 0, r_len),
    )
    first[pairs] = p_len[pairs] + at
    pairs, at = _mismatches(
        prompts.values, prompts.starts[prev], prompts.values, c_start, np.minimum(p_len, c_len)
    )
    first[pairs] = at
    return first


def _resyncs(
    prompts: _Lists, responses: _Lists, prev: np.ndarray, cur: np.ndarray, at: np.ndarray
) -> np.ndarray:
    """For each broken pair, whether prompt[cur] differs from X = prompt[prev] + response[prev] only by
    the same text tokenised differently around ``at``: after skipping ``a`` tokens of X and ``b`` of the
    prompt (1 <= a, b <= :data:`DRIFT_WINDOW`), the rest of X follows in the prompt unchanged; or X
    ends within ``DRIFT_WINDOW`` tokens of ``at`` (a merge across its end). Dropped content
    (``b = 0``, e.g. a past ``<think>`` block) or inserted content (``a = 0``) does not resync."""
    n = len(cur)
    x_len = prompts.lengths[prev] + responses.lengths[prev]
    tail = x_len - at
    done = tail <= DRIFT_WINDOW  # X ends inside the divergent region
    # X of each pair, flat: its prompt then its response, from one combined value buffer
    combined = np.concatenate([prompts.values, responses.values])
    starts = np.stack([prompts.starts[prev], len(prompts.values) + responses.starts[prev]], 1).ravel()
    lens = np.stack([prompts.lengths[prev], responses.lengths[prev]], 1).ravel()
    x_values = combined[_ranges(starts, lens)] if n else combined[:0]
    x_start = np.r_[0, np.cumsum(x_len)[:-1]] if n else np.zeros(0, dtype=np.int64)
    for a in range(1, DRIFT_WINDOW + 1):
        for b in range(1, DRIFT_WINDOW + 1):
            m = tail - a
            todo = np.flatnonzero(~done & (m > 0) & (at + b + m <= prompts.lengths[cur]))
            if len(todo) == 0:
                continue
            bad, _ = _mismatches(
                x_values, x_start[todo] + at[todo] + a,
                prompts.values, prompts.starts[cur[todo]] + at[todo] + b, m[todo],
            )  # fmt: skip
            ok = np.ones(len(todo), dtype=bool)
            ok[bad] = False
            done[todo[ok]] = True
    return done


def merge_turns(table: pa.Table) -> tuple[pa.Table, int]:
    """Trajectory rows (``schemas.trajectories()``) of whole rollouts in ``table``, whose rows are
    sorted by (rollout_id, turn) and carry the triplet columns plus group_key, traj_reward, split,
    rollout_end. Also returns how many responses had no usable logprobs (left at 0)."""
    schema = schemas.trajectories()
    if table.num_rows == 0:
        return schema.empty_table(), 0
    group = _group_codes(table)
    order = np.lexsort((table.column("turn").to_numpy(), group))
    if np.any(order != np.arange(len(order))):  # several agents interleaved: regroup the rows
        table = table.take(pa.array(order))
        group = group[order]
    n = table.num_rows
    prompts = _Lists(table.column("prompt_token_ids"))
    responses = _Lists(table.column("response_token_ids"))
    logprobs = _Lists(table.column("response_logprobs"))

    same = np.zeros(n, dtype=bool)
    same[1:] = group[1:] == group[:-1]
    cur = np.flatnonzero(same)
    prev = cur - 1
    first = _first_mismatch(prompts, responses, prev, cur)
    extends = first >= prompts.lengths[prev] + responses.lengths[prev]
    new_seg = ~same
    new_seg[cur[~extends]] = True
    reason = np.full(n, None, dtype=object)
    broken, at = cur[~extends], first[~extends]
    kind = np.where(at == 0, 2, np.where(_resyncs(prompts, responses, broken - 1, broken, at), 1, 0))
    reason[broken] = np.array(REASONS, dtype=object)[kind]

    seg_id = np.cumsum(new_seg) - 1
    seg_first = np.flatnonzero(new_seg)
    seg_last = np.r_[seg_first[1:] - 1, n - 1]
    group_start = np.maximum.accumulate(np.where(~same, np.arange(n), 0))
    segment = (seg_id - seg_id[group_start])[seg_first].astype(np.int32)

    # tokens = last turn's prompt + response, gathered from one combined value buffer
    combined = np.concatenate([prompts.values, responses.values]).astype(np.int32, copy=False)
    starts2 = np.stack(
        [prompts.starts[seg_last], len(prompts.values) + responses.starts[seg_last]], 1
    ).ravel()
    lens2 = np.stack([prompts.lengths[seg_last], responses.lengths[seg_last]], 1).ravel()
    tokens = combined[_ranges(starts2, lens2)]
    tok_len = prompts.lengths[seg_last] + responses.lengths[seg_last]
    out_off = np.r_[0, np.cumsum(tok_len)]

    # each turn's response: mask 1 and its logprobs at offset len(prompt) of its segment's row
    where = _ranges(out_off[seg_id] + prompts.lengths, responses.lengths)
    mask = np.zeros(len(tokens), dtype=np.int8)
    mask[where] = 1
    lp_out = np.zeros(len(tokens), dtype=np.float32)
    usable = logprobs.valid & (logprobs.lengths == responses.lengths)
    if usable.any():
        dest = _ranges(out_off[seg_id[usable]] + prompts.lengths[usable], responses.lengths[usable])
        lp_out[dest] = logprobs.values[_ranges(logprobs.starts[usable], logprobs.lengths[usable])]
    missing_logprobs = int(np.count_nonzero(~usable & (responses.lengths > 0)))

    big = np.iinfo(np.int64).max
    pv_filled = pc.fill_null(table.column("policy_version"), big).to_numpy().astype(np.int64)
    pv_min = np.minimum.reduceat(pv_filled, seg_first)
    offsets = pa.array(out_off.astype(np.int32))
    firsts = pa.array(seg_first)

    def pick(name: str) -> pa.Array:
        return table.column(name).take(firsts).combine_chunks()

    columns = {
        "rollout_id": pick("rollout_id"),
        "task_id": pick("task_id"),
        "agent_name": pick("agent_name"),
        "group_key": pick("group_key"),
        "segment": pa.array(segment, pa.int32()),
        "split_reason": pa.array(reason[seg_first], pa.string()),
        "tokens": pa.ListArray.from_arrays(offsets, pa.array(tokens, pa.int32())),
        "logprobs": pa.ListArray.from_arrays(offsets, pa.array(lp_out, pa.float32())),
        "action_mask": pa.ListArray.from_arrays(offsets, pa.array(mask, pa.int8())),
        "reward": pick("traj_reward"),
        "num_turns": pa.array((seg_last - seg_first + 1).astype(np.int32)),
        "policy_version": pa.array(pv_min, pa.int64(), mask=pv_min == big),
        "split": pick("split"),
        "end_time": pick("rollout_end"),
    }
    arrays = [columns[f.name].cast(f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema), missing_logprobs
