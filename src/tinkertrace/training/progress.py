"""A live progress line of training steps (rich), or nothing when it is turned off."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.progress import Progress, ProgressColumn


class StepProgress:
    """``with StepProgress(enabled, console, columns, total=..., completed=..., **fields) as bar:``
    then ``bar.update(completed=..., **fields)`` after each step; no-ops when not ``enabled``."""

    def __init__(
        self, enabled: bool, console: Console | None, columns: Sequence[ProgressColumn | str], **task: Any
    ) -> None:
        self.bar = Progress(*columns, console=console) if enabled else None
        self.task = task

    def __enter__(self) -> StepProgress:
        if self.bar is not None:
            self.bar.__enter__()
            self.task_id = self.bar.add_task("steps", **self.task)
        return self

    def update(self, **fields: Any) -> None:
        """Move the line on (``completed=``) and refresh its fields."""
        if self.bar is not None:
            self.bar.update(self.task_id, **fields)

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)
