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
    idx: np.ndarray = np.arange(total, dtype=dtype)
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


def _histories(prompts: _Lists, responses: _Lists, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """prompt + response of each of ``rows``, as one flat value array and each row's length."""
    combined = np.concatenate([prompts.values, responses.values])
    starts = np.stack([prompts.starts[rows], len(prompts.values) + responses.starts[rows]], 1).ravel()
    lengths = np.stack([prompts.lengths[rows], responses.lengths[rows]], 1).ravel()
    return combined[_ranges(starts, lengths)], prompts.lengths[rows] + responses.lengths[rows]


def _resyncs(
    prompts: _Lists, responses: _Lists, prev: np.ndarray, cur: np.ndarray, at: np.ndarray
) -> np.ndarray:
    """For each broken pair, whether prompt[cur] differs from X = prompt[prev] + response[prev] only by
    the same text tokenised differently around ``at``: after skipping ``a`` tokens of X and ``b`` of the
    prompt (1 <= a, b <= :data:`DRIFT_WINDOW`), the rest of X follows in the prompt unchanged; or X
    ends within ``DRIFT_WINDOW`` tokens of ``at`` (a merge across its end). Dropped content
    (``b = 0``, e.g. a past ``<think>`` block) or inserted content (``a = 0``) does not resync."""
    x_values, x_len = _histories(prompts, responses, prev)
    x_start = np.cumsum(x_len) - x_len
    tail = x_len - at
    done = tail <= DRIFT_WINDOW  # X ends inside the divergent region
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


class _Turns:
    """The turns of a table sorted by (rollout, agent) group then turn, as flat list columns."""

    def __init__(self, table: pa.Table, group: np.ndarray) -> None:
        self.prompts = _Lists(table.column("prompt_token_ids"))
        self.responses = _Lists(table.column("response_token_ids"))
        self.logprobs = _Lists(table.column("response_logprobs"))
        # whether row i continues the (rollout, agent) group of row i - 1
        self.follows = np.r_[False, group[1:] == group[:-1]]


def _split_reasons(turns: _Turns) -> np.ndarray:
    """Per row: the reason it starts a new segment although it follows a turn of its group
    (``template_change``, ``retokenization_drift`` or ``other``), else None."""
    cur = np.flatnonzero(turns.follows)
    at = _first_mismatch(turns.prompts, turns.responses, cur - 1, cur)
    broken = at < turns.prompts.lengths[cur - 1] + turns.responses.lengths[cur - 1]
    cur, at = cur[broken], at[broken]
    drift = _resyncs(turns.prompts, turns.responses, cur - 1, cur, at)
    reasons = np.full(len(turns.follows), None, dtype=object)
    reasons[cur] = np.where(at == 0, "other", np.where(drift, "retokenization_drift", "template_change"))
    return reasons


class _Segments:
    """Consecutive turns merged into one trajectory row: a segment starts at each group's first
    turn and at each turn with a split reason."""

    def __init__(self, turns: _Turns, reasons: np.ndarray) -> None:
        starts = ~turns.follows | (reasons != None)  # noqa: E711 (elementwise over an object array)
        self.first = np.flatnonzero(starts)  # per segment: its first and last row
        self.last = np.r_[self.first[1:] - 1, len(starts) - 1]
        self.of_row = np.cumsum(starts) - 1  # per row: its segment
        # per segment: its number within its group
        opens_group = ~turns.follows[self.first]
        n = len(self.first)
        self.index = np.arange(n) - np.maximum.accumulate(np.where(opens_group, np.arange(n), 0))


def _sequences(turns: _Turns, seg: _Segments) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Each segment's tokens (its last turn's prompt + response) with offsets, and its action mask
    and logprobs: 1 and the sampling logprob on each turn's response tokens, which sit at offset
    len(prompt) of the turn. Also how many responses had no usable logprobs (left at 0)."""
    tokens, lengths = _histories(turns.prompts, turns.responses, seg.last)
    offsets = np.r_[0, np.cumsum(lengths)]
    response_at = offsets[seg.of_row] + turns.prompts.lengths  # per turn
    mask = np.zeros(len(tokens), dtype=np.int8)
    mask[_ranges(response_at, turns.responses.lengths)] = 1
    logprobs = np.zeros(len(tokens), dtype=np.float32)
    lp = turns.logprobs
    usable = lp.valid & (lp.lengths == turns.responses.lengths)
    logprobs[_ranges(response_at[usable], lp.lengths[usable])] = lp.values[
        _ranges(lp.starts[usable], lp.lengths[usable])
    ]
    missing = int(np.count_nonzero(~usable & (turns.responses.lengths > 0)))
    return offsets, tokens, mask, logprobs, missing


def _oldest_policy_version(table: pa.Table, seg: _Segments) -> pa.Array:
    never = np.iinfo(np.int64).max
    versions = pc.fill_null(table.column("policy_version"), never).to_numpy().astype(np.int64)
    oldest = np.minimum.reduceat(versions, seg.first)
    return pa.array(oldest, pa.int64(), mask=oldest == never)


def _response_versions(table: pa.Table, seg: _Segments) -> pa.Array:
    """Per segment: its turns' ``response_policy_versions`` concatenated (one per sampled token, in
    order); null where a turn has none (or the table lacks the column)."""
    n = len(seg.first)
    if "response_policy_versions" not in table.column_names:
        return pa.nulls(n, pa.list_(pa.int64()))
    turns = _Lists(table.column("response_policy_versions"))
    lengths = np.add.reduceat(turns.lengths, seg.first)
    whole = np.minimum.reduceat(turns.valid.astype(np.int8), seg.first).astype(bool)
    values = turns.values[_ranges(turns.starts, turns.lengths)].astype(np.int64, copy=False)
    offsets = pa.array(np.r_[0, np.cumsum(lengths)].astype(np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(values, pa.int64()), mask=pa.array(~whole))


def _replies_cut(table: pa.Table, seg: _Segments) -> pa.Array:
    """Per segment: how many of its turns' replies were cut short (``truncated``; null when the table
    lacks the column)."""
    if "truncated" not in table.column_names:
        return pa.nulls(len(seg.first), pa.int32())
    cut = pc.fill_null(table.column("truncated"), False).to_numpy(zero_copy_only=False).astype(np.int32)
    return pa.array(np.add.reduceat(cut, seg.first), pa.int32())


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
        table, group = table.take(pa.array(order)), group[order]
    turns = _Turns(table, group)
    reasons = _split_reasons(turns)
    seg = _Segments(turns, reasons)
    offsets, tokens, mask, logprobs, missing = _sequences(turns, seg)

    def first_turns(name: str) -> pa.Array:
        return table.column(name).take(pa.array(seg.first)).combine_chunks()

    def lists(values: np.ndarray, type_: pa.DataType) -> pa.Array:
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(values, type_))

    columns = {
        "rollout_id": first_turns("rollout_id"),
        "task_id": first_turns("task_id"),
        "agent_name": first_turns("agent_name"),
        "group_key": first_turns("group_key"),
        "segment": pa.array(seg.index, pa.int32()),
        "split_reason": pa.array(reasons[seg.first], pa.string()),
        "tokens": lists(tokens.astype(np.int32, copy=False), pa.int32()),
        "logprobs": lists(logprobs, pa.float32()),
        "action_mask": lists(mask, pa.int8()),
        "reward": first_turns("traj_reward"),
        "num_turns": pa.array((seg.last - seg.first + 1).astype(np.int32)),
        "policy_version": _oldest_policy_version(table, seg),
        "split": first_turns("split"),
        "end_time": first_turns("rollout_end"),
        "response_policy_versions": _response_versions(table, seg),
        "replies_cut": _replies_cut(table, seg),
    }
    return pa.Table.from_arrays([columns[f.name].cast(f.type) for f in schema], schema=schema), missing
