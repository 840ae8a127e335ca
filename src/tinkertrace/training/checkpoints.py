"""``<log_dir>/checkpoints.jsonl``: one line per saved checkpoint, read back for resume.

Each record: ``name``, ``step`` (steps completed), ``epoch``, ``state_path`` (weights + optimizer,
for resume), ``sampler_path`` (weights for a SamplingClient), ``trained_rollout_ids`` (rollouts
trained since the previous checkpoint: the union over the file is everything trained),
``data_fingerprint`` and the data-order settings (``seed``, ``groups_per_batch``, ``shuffle``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tinkertrace.training.jsonl import append_jsonl, read_jsonl

CHECKPOINTS_FILE = "checkpoints.jsonl"


def read_checkpoints(log_dir: Path) -> list[dict[str, Any]]:
    """All checkpoint records in ``log_dir`` (oldest first; empty when none)."""
    return read_jsonl(Path(log_dir) / CHECKPOINTS_FILE)


def append_checkpoint(log_dir: Path, record: dict[str, Any]) -> None:
    """Append one record (flushed and fsynced, so a crash right after keeps it)."""
    append_jsonl(Path(log_dir) / CHECKPOINTS_FILE, [record], fsync=True)
