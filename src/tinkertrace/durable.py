"""Renames that survive a power loss, not only a kill -9.

A rename is atomic, but it is a change to the folders' entries: until the folder itself is fsynced, a
power loss may undo it (the file then back under its temporary name, or gone). :func:`durable_rename`
fsyncs the file's data before the rename and each folder touched after it. Used by the SDK's spool
(which the endpoint's journal delivers to a collector through); the Parquet writer and compaction use
:func:`fsync_path` for their folders.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: str | os.PathLike[str]) -> None:
    """Flush a file's data, or a folder's entries (a rename, a new file), to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable_rename(src: Path, dst: Path, *, synced: bool = False) -> Path:
    """Rename ``src`` to ``dst`` (``os.rename``: FileNotFoundError when another process took ``src``
    first) so that a power loss keeps it: ``src``'s data fsynced before (skipped when ``synced``: the
    caller just fsynced it), ``dst``'s folder (and ``src``'s, when another) after. Returns ``dst``."""
    if not synced:
        fsync_path(src)
    os.rename(src, dst)
    fsync_path(dst.parent)
    if Path(src).parent.resolve() != Path(dst).parent.resolve():
        fsync_path(Path(src).parent)
    return dst
