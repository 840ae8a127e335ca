"""Rollout upload to OpenReward, where it is configured: with ``openreward_run_name`` and
``$OPENREWARD_API_KEY``, each ORS episode's transcript is spooled by its agent (one JSON line per
finished rollout, a file per worker process) and sent as soon as it is written through the
``openreward`` SDK's rollout API by :mod:`tinkertrace.ors.uploader`, which follows the spool for the
whole run in the environment server's venv (the package pins what the trainer's venv cannot take).
Without a key nothing is sent, and the run says so.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

UPLOADER = Path(__file__).with_name("uploader.py")
DEFAULT_PYTHON = Path(".venv-openreward") / "bin" / "python"


def upload_settings(run_name: str | None, spool_dir: Path) -> tuple[dict[str, Any], str | None]:
    """The agent arguments that spool rollouts for upload (none without a run name or a key), and
    the note to show once when a run name is set but no key."""
    if not run_name:
        return {}, None
    if not os.environ.get("OPENREWARD_API_KEY"):
        return (
            {},
            "openreward_run_name is set but OPENREWARD_API_KEY is not: rollouts are not uploaded"
            f" (run {run_name!r})",
        )
    return {"upload_run": run_name, "upload_spool": str(spool_dir)}, None


def spool_rollout(
    spool_dir: str, run_name: str, environment: str, task: dict[str, Any], transcript: dict[str, Any]
) -> None:
    """Append one finished rollout (``messages``, ``rewards`` by message index, ``finished``) to this
    process's spool file."""
    folder = Path(spool_dir)
    folder.mkdir(parents=True, exist_ok=True)
    row = {
        "run_name": run_name,
        "rollout_name": str(task["id"]),
        "environment": environment,
        "split": task["split"],
        "index": int(task["index"]),
        **transcript,
    }
    with (folder / f"rollouts-{os.getpid()}.jsonl").open("a", encoding="utf-8") as out:
        out.write(json.dumps(row, default=str) + "\n")


class SpoolUploader:
    """The SDK uploader (:mod:`tinkertrace.ors.uploader`) following ``spool_dir`` for a whole run, so
    each rollout is sent as its episode finishes; in ``python`` (default ``.venv-openreward``'s, else
    ``$TINKERTRACE_OPENREWARD_PYTHON``). Use as a context manager; :attr:`said` is what it reported."""

    def __init__(self, spool_dir: Path, python: str | None = None, timeout_s: float = 600) -> None:
        self.spool_dir = Path(spool_dir)
        self.python = python or os.environ.get("TINKERTRACE_OPENREWARD_PYTHON") or str(DEFAULT_PYTHON)
        self.timeout_s = timeout_s
        self.process: subprocess.Popen[str] | None = None
        self.said = ""

    def __enter__(self) -> SpoolUploader:
        if not Path(self.python).exists():
            self.said = (
                f"rollouts not uploaded: no Python with the openreward package at {self.python} "
                "(make openreward-env)"
            )
            return self
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        (self.spool_dir / "stop").unlink(missing_ok=True)
        command = [self.python, str(UPLOADER), str(self.spool_dir)]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop it once it has sent what is spooled (the run is over: nothing more is written)."""
        if self.process is None:
            return
        (self.spool_dir / "stop").touch()
        try:
            out, err = self.process.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, err = self.process.communicate()
        code = self.process.returncode
        self.said = out.strip() if code == 0 else f"OpenReward upload failed ({code}): {err.strip()[-500:]}"
