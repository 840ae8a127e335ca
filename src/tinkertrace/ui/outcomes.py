"""What training did with each rollout, from the trainer's own records, for the ui's index.

The trainer writes ``outcomes.jsonl`` (:mod:`tinkertrace.training.outcomes`): per step, each
trajectory row trained (and how many of its tokens its Datum kept) or dropped, with the reason. The
index loads those lines into the table ``outcome_rows`` and folds them into one row per rollout
(``fates``); the rollout list then says: trained at step N, dropped (stale by k versions at step N,
constant-reward group, no trainable token, bad reward), or, when training never saw it, incomplete,
failed or not trained. Steps are the 0-based steps of ``metrics.jsonl`` (the plots' x axis).

Runs logged before ``outcomes.jsonl`` existed have only ``checkpoints.jsonl``: their trained and
dropped rollout ids are read from it, without the step (a checkpoint may cover several steps) or the
reason (``dropped``, reason not recorded).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb

from tinkertrace.spanstore.sql import literal, literal_list
from tinkertrace.training.checkpoints import CHECKPOINTS_FILE
from tinkertrace.training.outcomes import DROP_REASONS, OUTCOMES_FILE

# The values of the list's ``outcome`` filter: each rollout has one; "dropped" matches any drop.
OUTCOMES = ("trained", "dropped", *DROP_REASONS, "incomplete", "failed", "not_trained")
DROPS = (*DROP_REASONS, "dropped")
IS_DROPPED = f"outcome IN ({literal_list(DROPS)})"  # SQL over the rollout list
DROP_LABELS = {
    "stale": "stale",
    "constant_reward": "constant-reward group",
    "no_trainable_tokens": "no trainable token",
    "bad_reward": "missing or NaN reward",
    "bad_lengths": "tokens/logprobs/mask lengths differ",
    "dropped": "reason not recorded",
}

_EMPTY = (
    "SELECT NULL::VARCHAR AS rollout_id, NULL::VARCHAR AS agent_name, NULL::BIGINT AS segment, "
    "NULL::BIGINT AS step, NULL::VARCHAR AS outcome, NULL::VARCHAR AS reason, "
    "NULL::BIGINT AS versions_behind, NULL::BIGINT AS tokens WHERE false"
)
_COLUMNS = (
    "{rollout_id: 'VARCHAR', agent_name: 'VARCHAR', segment: 'BIGINT', step: 'BIGINT', "
    "outcome: 'VARCHAR', reason: 'VARCHAR', versions_behind: 'BIGINT', tokens: 'BIGINT'}"
)
_CHECKPOINT_COLUMNS = "{trained_rollout_ids: 'VARCHAR[]', dropped_rollout_ids: 'VARCHAR[]'}"

# One row per rollout the trainer recorded: its first trained step (and how many steps trained it),
# else its first drop with the reason.
FATES_SQL = """
SELECT rollout_id,
       min(step) FILTER (WHERE outcome = 'trained') AS trained_step,
       count(DISTINCT COALESCE(step, -1)) FILTER (WHERE outcome = 'trained') AS times_trained,
       arg_min(reason, COALESCE(step, -1)) FILTER (WHERE outcome = 'dropped') AS drop_reason,
       min(step) FILTER (WHERE outcome = 'dropped') AS drop_step,
       max(versions_behind) FILTER (WHERE outcome = 'dropped') AS versions_behind
FROM outcome_rows WHERE rollout_id IS NOT NULL GROUP BY rollout_id
"""

# The rollout list's outcome column (``r``: the rollout row joined with its fate).
OUTCOME_SQL = """CASE WHEN times_trained > 0 THEN 'trained'
     WHEN drop_reason IS NOT NULL THEN drop_reason
     WHEN incomplete IS NOT NULL THEN 'incomplete'
     WHEN status = 'failed' THEN 'failed'
     ELSE 'not_trained' END"""


def record_files(log_dirs: Sequence[Path]) -> list[Path]:
    """The files the fates come from: each log folder's outcomes.jsonl, else its checkpoints.jsonl."""
    found = []
    for log_dir in log_dirs:
        for name in (OUTCOMES_FILE, CHECKPOINTS_FILE):
            if (log_dir / name).is_file():
                found.append(log_dir / name)
                break
    return found


def outcome_rows_sql(files: Sequence[Path]) -> str:
    """SQL: the outcome rows of ``files`` (outcomes.jsonl lines; checkpoints.jsonl ids as a fallback)."""
    parts = [_EMPTY]
    for path in files:
        if path.name == OUTCOMES_FILE:
            parts.append(
                f"SELECT * FROM read_json({literal(path)}, format = 'newline_delimited', "
                f"columns = {_COLUMNS}, ignore_errors = true)"
            )
        else:
            source = (
                f"read_json({literal(path)}, format = 'newline_delimited', "
                f"columns = {_CHECKPOINT_COLUMNS}, ignore_errors = true)"
            )
            for column, outcome, reason in (
                ("trained_rollout_ids", "trained", "NULL"),
                ("dropped_rollout_ids", "dropped", "'dropped'"),
            ):
                parts.append(
                    f"SELECT unnest({column}) AS rollout_id, NULL, NULL, NULL, '{outcome}', {reason}, "
                    f"NULL, NULL FROM {source}"
                )
    return " UNION ALL ".join(parts)


def load(con: duckdb.DuckDBPyConnection, files: Sequence[Path]) -> None:
    """(Re)load ``outcome_rows`` and ``fates`` from the trainer's record files."""
    con.execute(f"CREATE OR REPLACE TABLE outcome_rows AS {outcome_rows_sql(files)}")
    con.execute(f"CREATE OR REPLACE TABLE fates AS {FATES_SQL}")


def outcome_text(row: dict[str, Any]) -> str:
    """What training did with a rollout, in words (a list row with ``outcome`` and its fate columns)."""
    outcome = row.get("outcome")
    if outcome == "trained":
        step, times = row.get("trained_step"), row.get("times_trained") or 1
        where = f"at step {step}" if step is not None else "(step not recorded)"
        return f"trained {where}" + (f", {times} steps in all" if times > 1 else "")
    if outcome in DROPS:
        step = row.get("drop_step")
        when = f"at step {step}" if step is not None else "before training"
        why = DROP_LABELS[outcome]
        if outcome == "stale" and row.get("versions_behind") is not None:
            why = f"stale by {row['versions_behind']} versions"
        return f"dropped {when}: {why}"
    if outcome == "incomplete":
        return f"not trained: incomplete ({row.get('incomplete')})"
    if outcome == "failed":
        return "not trained: the rollout failed"
    return "not trained"


def row_fates(con: duckdb.DuckDBPyConnection, rollout_id: str) -> dict[tuple[Any, Any], dict[str, Any]]:
    """(agent, segment) -> what training did with that trajectory row of ``rollout_id``: the steps that
    trained it and the tokens its Datum kept, or the first drop."""
    rows = con.execute(
        """
        SELECT agent_name, segment,
               list(DISTINCT step ORDER BY step) FILTER (WHERE outcome = 'trained') AS steps,
               max(tokens) FILTER (WHERE outcome = 'trained') AS tokens,
               arg_min(reason, COALESCE(step, -1)) FILTER (WHERE outcome = 'dropped') AS reason,
               min(step) FILTER (WHERE outcome = 'dropped') AS drop_step
        FROM outcome_rows WHERE rollout_id = ? GROUP BY ALL
        """,
        [rollout_id],
    ).fetchall()
    keys = ("steps", "tokens", "reason", "drop_step")
    return {(a, s): dict(zip(keys, rest, strict=True)) | {"steps": rest[0] or []} for a, s, *rest in rows}
