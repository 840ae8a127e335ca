"""Where the local engine keeps checkpoints: ``tinker://<run_id>/<kind>/<name>`` under a base folder.

``tinker://<run_id>/weights/<name>`` (training state: trainable weights, optimizer, spec) and
``tinker://<run_id>/sampler_weights/<name>`` (a complete Hugging Face model folder with the
tokenizer) resolve to ``<base_dir>/<run_id>/<kind>/<name>``. The default base folder is
``$TINKERTRACE_HOME/engine``, with ``TINKERTRACE_HOME`` defaulting to ``~/.cache/tinkertrace``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

SCHEME = "tinker://"
WEIGHTS = "weights"
SAMPLER_WEIGHTS = "sampler_weights"
Kind = Literal["weights", "sampler_weights"]
META_FILE = "checkpoint.json"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
"""Run ids may also hold ':' (Tinker's model ids look like ``<session>:train:<n>``)."""


class CheckpointError(ValueError):
    """A checkpoint path is malformed, missing, or of the wrong kind."""


def default_base_dir() -> Path:
    """``$TINKERTRACE_HOME/engine`` (``~/.cache/tinkertrace/engine`` by default)."""
    home = os.environ.get("TINKERTRACE_HOME") or str(Path.home() / ".cache" / "tinkertrace")
    return Path(home).expanduser() / "engine"


def new_run_id() -> str:
    """A fresh run id (the SDK's model id)."""
    return f"run-{uuid.uuid4().hex[:12]}"


def check_name(name: str, what: str = "checkpoint name") -> str:
    """Names become folder names: letters, digits, '.', '_', '-' only (run ids also ':')."""
    pattern, allowed = (_RUN_ID, "'.', '_', ':' or '-'") if what == "run id" else (_NAME, "'.', '_' or '-'")
    if not isinstance(name, str) or not pattern.match(name):
        raise CheckpointError(f"invalid {what} {name!r}: use letters, digits, {allowed}")
    return name


def make_path(run_id: str, kind: Kind, name: str) -> str:
    """The ``tinker://`` path of a checkpoint."""
    return f"{SCHEME}{check_name(run_id, 'run id')}/{kind}/{check_name(name)}"


def parse_path(path: str) -> tuple[str, Kind, str]:
    """Split a ``tinker://run/kind/name`` path; raise CheckpointError when malformed."""
    if not isinstance(path, str) or not path.startswith(SCHEME):
        raise CheckpointError(
            f"checkpoint path must look like tinker://<run_id>/weights/<name>, got {path!r}"
        )
    parts = path[len(SCHEME) :].split("/")
    if len(parts) != 3 or parts[1] not in (WEIGHTS, SAMPLER_WEIGHTS):
        raise CheckpointError(
            f"checkpoint path must look like tinker://<run_id>/(weights|sampler_weights)/<name>, got {path!r}"
        )
    run_id, kind, name = parts
    check_name(run_id, "run id")
    check_name(name)
    return run_id, kind, name  # type: ignore[return-value]


class CheckpointStore:
    """Resolves and writes checkpoints under one base folder."""

    def __init__(self, base_dir: str | Path | None = None) -> None:
        self.base_dir = Path(base_dir).expanduser() if base_dir is not None else default_base_dir()

    def folder(self, run_id: str, kind: Kind, name: str) -> Path:
        return self.base_dir / check_name(run_id, "run id") / kind / check_name(name)

    def resolve(self, path: str, expected_kind: Kind | None = None) -> tuple[Path, dict[str, Any]]:
        """The folder and metadata of an existing checkpoint; CheckpointError if absent or wrong kind."""
        run_id, kind, name = parse_path(path)
        if expected_kind is not None and kind != expected_kind:
            raise CheckpointError(f"{path!r} is a {kind} checkpoint; this call needs {expected_kind}")
        folder = self.folder(run_id, kind, name)
        meta_file = folder / META_FILE
        if not meta_file.is_file():
            raise CheckpointError(f"checkpoint {path!r} not found (looked in {folder})")
        try:
            return folder, json.loads(meta_file.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"checkpoint {path!r} is unreadable: {exc}") from exc

    def write(
        self,
        run_id: str,
        kind: Kind,
        name: str,
        meta: dict[str, Any],
        fill: Callable[[Path], None],
        overwrite: bool = False,
    ) -> str:
        """Write a checkpoint atomically: ``fill(tmp_folder)`` then metadata, then rename into place."""
        folder = self.folder(run_id, kind, name)
        path = make_path(run_id, kind, name)
        if folder.exists() and not overwrite:
            raise CheckpointError(f"checkpoint {path!r} already exists (pass overwrite=True to replace it)")
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = folder.parent / f".tmp-{name}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            fill(tmp)
            (tmp / META_FILE).write_text(json.dumps({**meta, "path": path}, indent=2, sort_keys=True))
            if folder.exists():
                shutil.rmtree(folder)
            tmp.rename(folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return path
