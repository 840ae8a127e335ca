"""``<log_dir>/checkpoints.jsonl``: one line per saved checkpoint, read back for resume.

Each record: ``name``, ``step`` (steps completed), ``epoch``, ``state_path`` (weights + optimizer,
for resume), ``sampler_path`` (weights for a SamplingClient), ``trained_rollout_ids`` (rollouts
trained since the previous checkpoint: the union over the file is everything trained),
``data_fingerprint`` and the data-order settings (``seed``, ``groups_per_batch``, ``shuffle``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tinkertrace.training.errors import DataError

CHECKPOINTS_FILE = "checkpoints.jsonl"


def read_checkpoints(log_dir: Path) -> list[dict[str, Any]]:
    """All checkpoint records in ``log_dir`` (oldest first; empty when none)."""
    path = Path(log_dir) / CHECKPOINTS_FILE
    if not path.exists():
        return []
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            raise DataError(f"{path} line {number} is not valid JSON; fix or remove that line") from None
    return records


def append_checkpoint(log_dir: Path, record: dict[str, Any]) -> None:
    """Append one record (flushed and fsynced, so a crash right after keeps it)."""
    path = Path(log_dir) / CHECKPOINTS_FILE
    with path.open("a") as fh:
        fh.write(json.dumps(record) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def trained_rollouts(log_dir: Path) -> set[str]:
    """Every rollout id recorded as trained in ``log_dir``'s checkpoints."""
    return {rid for record in read_checkpoints(log_dir) for rid in record.get("trained_rollout_ids", [])}
