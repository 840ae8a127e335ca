"""Rollout upload to OpenReward, where it is configured: with ``openreward_run_name`` and
``$OPENREWARD_API_KEY``, each ORS episode's transcript is spooled by its agent (one JSON line per
finished rollout, a file per worker process) and, when the run ends, sent through the ``openreward``
SDK's rollout API by :mod:`tinkertrace.ors.uploader`, run in the environment server's venv (the
package pins what the trainer's venv cannot take). Without a key nothing is sent, and the run says so.
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


def upload_spool(spool_dir: Path, python: str | None = None, timeout_s: float = 600) -> str:
    """Send every spooled rollout through the SDK (in ``python``, default ``.venv-openreward``'s,
    else ``$TINKERTRACE_OPENREWARD_PYTHON``); what the uploader said, or why nothing was sent."""
    files = sorted(Path(spool_dir).glob("rollouts-*.jsonl"))
    if not files:
        return "no OpenReward rollouts to upload"
    python = python or os.environ.get("TINKERTRACE_OPENREWARD_PYTHON") or str(DEFAULT_PYTHON)
    if not Path(python).exists():
        return (
            f"rollouts not uploaded: no Python with the openreward package at {python} (make openreward-env)"
        )
    merged = Path(spool_dir) / "upload.jsonl"
    merged.write_text("".join(f.read_text(encoding="utf-8") for f in files), encoding="utf-8")
    done = subprocess.run(
        [python, str(UPLOADER), str(merged)], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if done.returncode != 0:
        return f"OpenReward upload failed ({done.returncode}): {done.stderr.strip()[-500:]}"
    return done.stdout.strip()
