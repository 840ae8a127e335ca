"""The one JSON-lines reader/appender behind metrics.jsonl, checkpoints.jsonl and the agent logs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tinkertrace.training.checkpoints import append_checkpoint, read_checkpoints
from tinkertrace.training.errors import DataError
from tinkertrace.training.jsonl import append_jsonl, read_jsonl


def test_append_then_read_keeps_order_and_skips_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    assert read_jsonl(path) == []  # a missing file is empty
    append_jsonl(path, [{"a": 1}, {"a": 2}])
    with path.open("a") as fh:
        fh.write("\n")
    append_jsonl(path, [{"a": 3}], fsync=True)
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}, {"a": 3}]


def test_a_broken_line_is_named_or_skipped_on_request(tmp_path: Path) -> None:
    append_checkpoint(tmp_path, {"step": 1})
    with (tmp_path / "checkpoints.jsonl").open("a") as fh:
        fh.write('{"step": 2, "na')  # cut short by a killed writer
    with pytest.raises(DataError, match=r"checkpoints.jsonl line 2 is not valid JSON"):
        read_checkpoints(tmp_path)
    assert read_jsonl(tmp_path / "checkpoints.jsonl", skip_bad=True) == [{"step": 1}]
