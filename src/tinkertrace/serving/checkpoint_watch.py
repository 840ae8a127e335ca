"""Follow a training run's checkpoint record (JSON lines) and serve each new sampler checkpoint.

Each line the trainer appends names a sampler checkpoint path (``tinker://.../sampler_weights/...``)
and its policy version. The watcher reads only what was appended since its last look, loads the
newest record's weights with the :class:`PolicyHolder`'s loader and swaps them in. Lines that are
not JSON are skipped and counted, records without a sampler path are ignored, and a truncated or
replaced file is read again from the top. The version is the record's ``step`` (H5's training loop
writes ``sampler_path`` and ``step``), or ``policy_version``/``version`` when present.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tinkertrace.serving.policy import Policy, PolicyHolder, StalePolicyError

log = logging.getLogger(__name__)

PATH_KEYS = ("sampler_path", "sampling_path", "sampler_weights_path", "model_path")
VERSION_KEYS = ("policy_version", "version", "step")


@dataclass(frozen=True)
class CheckpointRecord:
    model_path: str
    version: int | None


def parse_record(record: Any) -> CheckpointRecord | None:
    """The sampler checkpoint a decoded record names, or None (e.g. a state-only checkpoint)."""
    if not isinstance(record, dict):
        return None
    path = next((record[k] for k in PATH_KEYS if isinstance(record.get(k), str) and record[k]), None)
    if path is None:
        return None
    version = next((record[k] for k in VERSION_KEYS if type(record.get(k)) is int), None)
    return CheckpointRecord(path, version)


@dataclass
class CheckpointWatcher:
    """Polls ``path`` every ``poll_s`` seconds; :meth:`poll_once` does one look (blocking)."""

    path: Path
    holder: PolicyHolder
    poll_s: float = 0.5
    offset: int = 0
    skipped_lines: int = 0
    errors: list[str] = field(default_factory=list)
    _partial: bytes = b""

    def _new_lines(self) -> list[str]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self.offset:  # truncated or replaced: start over
            self.offset, self._partial = 0, b""
        if size == self.offset:
            return []
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = self._partial + f.read(size - self.offset)
        self.offset = size
        *lines, self._partial = data.split(b"\n")  # the last piece may be a line still being written
        return [line.decode("utf-8", errors="replace") for line in lines if line.strip()]

    def poll_once(self) -> Policy | None:
        """Load and serve the newest record appended since the last look; the new policy or None."""
        records = []
        for line in self._new_lines():
            try:
                record = parse_record(json.loads(line))
            except json.JSONDecodeError:
                self.skipped_lines += 1
                log.warning("skipped a checkpoint record line that is not JSON: %.200s", line)
                continue
            if record is not None:
                records.append(record)
        if not records:
            return None
        newest = records[-1]
        if newest.version is not None and newest.version <= self.holder.version:
            return None
        try:
            policy = self.holder.load(newest.model_path, newest.version)
        except StalePolicyError:
            return None
        except Exception as exc:  # a bad path must not stop the watcher or the server
            self.errors.append(f"{newest.model_path}: {exc}")
            log.error("could not load checkpoint %s: %s", newest.model_path, exc)
            return None
        log.info("serving policy version %d from %s", policy.version, policy.model_path)
        return policy

    async def run(self) -> None:
        """Poll until cancelled (loading runs in a worker thread, so requests keep being served)."""
        while True:
            await asyncio.to_thread(self.poll_once)
            await asyncio.sleep(self.poll_s)

    def describe(self) -> dict[str, Any]:
        return {"path": str(self.path), "skipped_lines": self.skipped_lines, "errors": self.errors[-5:]}
