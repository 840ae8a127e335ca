"""Where the local engine keeps checkpoints: ``tinker://<run_id>/<kind>/<name>`` under a base folder.

``tinker://<run_id>/weights/<name>`` (training state: trainable weights, optimizer, spec),
``tinker://<run_id>/sampler_weights/<name>`` (a LoRA run's LoRA weights, or a full fine-tuning
run's complete Hugging Face model folder with the tokenizer) and
``tinker://<run_id>/external_weights/<name>`` (a Hugging Face folder with any LoRA merged in,
exported for download, optionally age-encrypted) resolve to ``<base_dir>/<run_id>/<kind>/<name>``;
each holds a ``checkpoint.json``. A run's own record (model spec, the name it was asked for,
``user_metadata``) is ``<base_dir>/<run_id>/run.json``. A checkpoint saved with a TTL carries
``expires_at`` (Unix seconds): once past it, it resolves as missing and
:meth:`CheckpointStore.sweep_expired` deletes it.
The default base folder is ``$TINKERTRACE_HOME/engine``, with ``TINKERTRACE_HOME`` defaulting to
``~/.cache/tinkertrace``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, Literal

SCHEME = "tinker://"
WEIGHTS: Final = "weights"
SAMPLER_WEIGHTS: Final = "sampler_weights"
EXTERNAL_WEIGHTS: Final = "external_weights"
Kind = Literal["weights", "sampler_weights", "external_weights"]
KINDS: tuple[Kind, ...] = (WEIGHTS, SAMPLER_WEIGHTS, EXTERNAL_WEIGHTS)
META_FILE = "checkpoint.json"
RUN_FILE = "run.json"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
"""Run ids may also hold ':' (Tinker's model ids look like ``<session>:train:<n>``)."""


class CheckpointError(ValueError):
    """A checkpoint path is malformed, missing, or of the wrong kind."""


class CheckpointNotFoundError(CheckpointError, LookupError):
    """A well-formed checkpoint path with nothing there (never saved, deleted, or expired)."""


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
    if kind not in KINDS:
        raise CheckpointError(f"unknown checkpoint kind {kind!r}: use one of {', '.join(KINDS)}")
    return f"{SCHEME}{check_name(run_id, 'run id')}/{kind}/{check_name(name)}"


def parse_path(path: str) -> tuple[str, Kind, str]:
    """Split a ``tinker://run/kind/name`` path; raise CheckpointError when malformed."""
    if not isinstance(path, str) or not path.startswith(SCHEME):
        raise CheckpointError(
            f"checkpoint path must look like tinker://<run_id>/weights/<name>, got {path!r}"
        )
    parts = path[len(SCHEME) :].split("/")
    if len(parts) != 3 or parts[1] not in KINDS:
        raise CheckpointError(
            f"checkpoint path must look like tinker://<run_id>/({'|'.join(KINDS)})/<name>, got {path!r}"
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
            raise CheckpointNotFoundError(f"checkpoint {path!r} not found (looked in {folder})")
        try:
            meta = json.loads(meta_file.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"checkpoint {path!r} is unreadable: {exc}") from exc
        if is_expired(meta):
            raise CheckpointNotFoundError(f"checkpoint {path!r} not found: it expired (its TTL has passed)")
        return folder, meta

    def write(
        self,
        run_id: str,
        kind: Kind,
        name: str,
        meta: dict[str, Any],
        fill: Callable[[Path], None],
        overwrite: bool = False,
        ttl_seconds: int | None = None,
    ) -> str:
        """Write a checkpoint atomically: ``fill(tmp_folder)`` then metadata, then rename into place.

        ``ttl_seconds`` (None: never) sets when it expires."""
        folder = self.folder(run_id, kind, name)
        path = make_path(run_id, kind, name)
        if folder.exists() and not overwrite:
            raise CheckpointError(f"checkpoint {path!r} already exists (pass overwrite=True to replace it)")
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = folder.parent / f".tmp-{name}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            fill(tmp)
            meta = {**meta, "path": path, "created": time.time(), "expires_at": expiry(ttl_seconds)}
            (tmp / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))
            if folder.exists():
                _remove(folder)
            tmp.rename(folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return path

    def delete(self, path: str) -> None:
        """Delete a checkpoint (it vanishes at once for readers: renamed away, then removed)."""
        folder, _ = self.resolve(path)
        _remove(folder)

    def set_ttl(self, path: str, ttl_seconds: int | None) -> None:
        """Make a checkpoint expire ``ttl_seconds`` from now (None: never)."""
        folder, meta = self.resolve(path)
        _write_json(folder / META_FILE, {**meta, "expires_at": expiry(ttl_seconds)})

    def sweep_expired(self) -> list[str]:
        """Delete every checkpoint whose TTL has passed; their paths."""
        swept = []
        for meta_file in self.base_dir.glob(f"*/*/*/{META_FILE}"):
            if meta_file.parent.name.startswith("."):
                continue  # being written or deleted
            try:
                meta = json.loads(meta_file.read_text())
                if is_expired(meta):
                    _remove(meta_file.parent)
                    swept.append(str(meta.get("path", meta_file.parent)))
            except (OSError, json.JSONDecodeError):
                continue  # unreadable, or deleted meanwhile
        return swept

    # -- runs ------------------------------------------------------------------------------------

    def write_run(self, run_id: str, record: dict[str, Any]) -> None:
        """Record a run (spec, requested model name, ``user_metadata``) in ``<run>/run.json``."""
        folder = self.base_dir / check_name(run_id, "run id")
        folder.mkdir(parents=True, exist_ok=True)
        _write_json(folder / RUN_FILE, record)

    def read_run(self, run_id: str) -> dict[str, Any] | None:
        """A run's record, or None (no record: a run from before records, or an unknown one)."""
        try:
            return dict(json.loads((self.base_dir / check_name(run_id, "run id") / RUN_FILE).read_text()))
        except (OSError, json.JSONDecodeError, TypeError, ValueError):
            return None


def expiry(ttl_seconds: int | None) -> float | None:
    """The Unix time ``ttl_seconds`` from now (None: never); ValueError unless positive."""
    if ttl_seconds is None:
        return None
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, int) or ttl_seconds < 1:
        raise ValueError(f"ttl_seconds must be a positive number of seconds or None, got {ttl_seconds!r}")
    return time.time() + ttl_seconds


def is_expired(meta: dict[str, Any]) -> bool:
    """Whether a checkpoint's ``expires_at`` has passed."""
    expires_at = meta.get("expires_at")
    return isinstance(expires_at, int | float) and expires_at <= time.time()


def _write_json(file: Path, data: dict[str, Any]) -> None:
    """Replace ``file`` atomically with ``data`` as JSON."""
    tmp = file.with_name(f".{file.name}.{uuid.uuid4().hex[:8]}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, file)


def _remove(folder: Path) -> None:
    """Rename ``folder`` to a hidden name (atomic for readers), then delete it."""
    doomed = folder.with_name(f".deleted-{folder.name}-{uuid.uuid4().hex[:8]}")
    folder.rename(doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def age_encrypter(recipients: list[str]) -> Callable[[Path], None]:
    """A function that replaces a file with its age encryption to ``recipients`` (``age1...`` keys or
    SSH public keys), named ``<file>.age``; ValueError naming a recipient that does not parse."""
    import pyrage

    parsed = []
    for text in recipients:
        kind = pyrage.ssh if text.startswith("ssh-") else pyrage.x25519
        try:
            parsed.append(kind.Recipient.from_str(text))
        except Exception as exc:  # pyrage raises its own error types
            raise ValueError(f"age_encryption_recipients: cannot parse {text!r}: {exc}") from None

    def encrypt(file: Path) -> None:
        pyrage.encrypt_file(str(file), str(file.with_name(file.name + ".age")), parsed)
        file.unlink()

    return encrypt
