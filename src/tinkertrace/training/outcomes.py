"""``<log_dir>/outcomes.jsonl``: what became of each trajectory row, in the trainer's own words.

One line per (step, trajectory row): ``step`` (the 0-based step of ``metrics.jsonl``; null for rows
left out while preparing the data, before any step), ``rollout_id``, ``agent_name``, ``segment``,
``outcome`` (``trained`` or ``dropped``), ``reason`` (why dropped: one of :data:`DROP_REASONS`),
``versions_behind`` (a stale row's age in policy versions) and ``tokens`` (a trained row: how many of
its tokens went into the Datum; a token is trained only if its action mask is 1, it is not the first
token, and it lies within these). Readers (``tinkertrace ui``) take the lines as rows of a table.

Lines of steps at or after a resumed run's start are rewritten, as in ``metrics.jsonl``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tinkertrace.training.jsonl import append_jsonl, read_jsonl

OUTCOMES_FILE = "outcomes.jsonl"
TRAINED = "trained"
DROPPED = "dropped"
DROP_REASONS = {
    "stale": "sampled too many policy versions before the step that would train it",
    "constant_reward": "every trajectory of its group got the same reward (zero advantage)",
    "no_trainable_tokens": "no sampled token left to train on (within max_tokens_per_datum)",
    "bad_reward": "its reward is missing or NaN",
    "bad_lengths": "its tokens, logprobs and action mask differ in length",
}
ROW_COLUMNS = ("rollout_id", "agent_name", "segment")


def outcome_rows(
    table: pa.Table, outcome: str, *, step: int | None, reason: str | None = None,
    tokens: Sequence[int] | None = None, versions_behind: Sequence[int] | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """One outcome record per row of ``table`` (trajectory rows: rollout, agent, segment)."""
    if reason is not None and reason not in DROP_REASONS:
        raise ValueError(f"unknown drop reason {reason!r}; choose one of {', '.join(DROP_REASONS)}")
    keys = table.select(list(ROW_COLUMNS)).to_pylist()
    return [
        {
            "step": step,
            **key,
            "outcome": outcome,
            "reason": reason,
            "versions_behind": None if versions_behind is None else int(versions_behind[i]),
            "tokens": None if tokens is None else int(tokens[i]),
        }
        for i, key in enumerate(keys)
    ]


def dropped_where(
    table: pa.Table, mask: np.ndarray, reason: str, *, step: int | None = None
) -> list[dict[str, Any]]:
    """Drop records for the rows of ``table`` where ``mask`` is true."""
    if not mask.any():
        return []
    return outcome_rows(table.filter(pa.array(mask)), DROPPED, step=step, reason=reason)


def read_outcomes(log_dir: Path) -> list[dict[str, Any]]:
    """Every record of ``<log_dir>/outcomes.jsonl`` (empty when there is none)."""
    return read_jsonl(Path(log_dir) / OUTCOMES_FILE, skip_bad=True)


class OutcomeLog:
    """Appends outcome records; opening it for a run starting at ``start_step`` keeps only the lines
    of earlier steps (a resumed run rewrites the steps it repeats and its data preparation)."""

    def __init__(self, log_dir: Path, start_step: int = 0) -> None:
        self.path = Path(log_dir) / OUTCOMES_FILE
        kept = [r for r in read_outcomes(log_dir) if r.get("step") is not None and r["step"] < start_step]
        self.path.write_text("")
        append_jsonl(self.path, kept)

    def write(self, records: list[dict[str, Any]]) -> None:
        """Append ``records`` (flushed to disk before this returns)."""
        if records:
            append_jsonl(self.path, records, fsync=True)
