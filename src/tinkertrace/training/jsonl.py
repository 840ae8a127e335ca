"""JSON-lines files (one record per line): the run logs ``metrics.jsonl`` and ``checkpoints.jsonl``
and the demo agents' rollout logs are all read and appended here."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tinkertrace.training.errors import DataError


def read_jsonl(path: Path, *, skip_bad: bool = False) -> list[dict[str, Any]]:
    """Every record of ``path`` in order; empty when the file does not exist. Blank lines are
    ignored; a line that is not JSON raises :class:`DataError` naming it, or with ``skip_bad`` is
    left out (e.g. a last line cut short by a killed writer)."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if not skip_bad:
                raise DataError(f"{path} line {number} is not valid JSON; fix or remove that line") from None
    return records


def append_jsonl(path: Path, records: Iterable[dict[str, Any]], *, fsync: bool = False) -> None:
    """Append ``records``, one line each; with ``fsync`` the data is on disk when this returns."""
    with Path(path).open("a") as fh:
        fh.writelines(json.dumps(record) + "\n" for record in records)
        fh.flush()
        if fsync:
            os.fsync(fh.fileno())
