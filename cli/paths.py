"""The folders commands read, checked before anything runs: a path that does not exist, or an
object-store URL (not supported yet), is one ``error:`` line naming it and exit code 2, never an empty
result."""

from __future__ import annotations

import os
from pathlib import Path

from tinkertrace.cli.extras import fail
from tinkertrace.store_paths import StorePathError, require_existing, require_local


def existing(
    path: str | os.PathLike[str], what: str = "spans folder", *, folder: bool = True, hint: str = ""
) -> Path:
    """``path`` when it exists (a folder, with ``folder``); else exit 2 with one error naming it."""
    try:
        return require_existing(path, what, folder=folder, hint=hint)
    except StorePathError as exc:
        raise fail(exc) from None


def local(path: str | os.PathLike[str], what: str) -> Path:
    """``path`` when it is not an object-store URL (it may not exist yet); else exit 2 saying so."""
    try:
        return require_local(path, what)
    except StorePathError as exc:
        raise fail(exc) from None
