"""Where stores live: a path that does not exist, or an object-store URL (not supported yet), is a
:class:`StorePathError` naming it, never an empty store. Light on purpose (no DuckDB, no pyarrow): the
command line imports it, and an SDK-only install runs the command line."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tinkertrace.settings import UserError

# ``s3://bucket/prefix`` (``s3:/bucket/prefix`` once a ``Path`` collapsed its slashes): a URL scheme of
# two or more letters, so a Windows drive (``C:/``) is not one
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):/+")


class StorePathError(UserError):
    """A spans (or trajectories, or run) folder that cannot be read: it does not exist, is not a
    folder, or is an object-store URL (not supported yet)."""


def object_store_url(path: str | os.PathLike[str]) -> str | None:
    """``path`` as the URL it was written as (``s3://tt/spans``) when it is one, else None."""
    text = os.fspath(path)
    match = _URL.match(text)
    return None if match is None else f"{match.group(1)}://{text[match.end() :]}"


def require_local(path: str | os.PathLike[str], what: str = "spans folder") -> Path:
    """``path`` as a Path; :class:`StorePathError` when it is an object-store URL."""
    if (url := object_store_url(path)) is not None:
        raise StorePathError(
            f"{what} {url}: object-store URLs ({url.split('://', 1)[0]}://...) are not supported yet; give "
            "a local path (copy to or from the store yourself, e.g. with `aws s3 sync`)"
        )
    return Path(path)


def require_existing(
    path: str | os.PathLike[str], what: str = "spans folder", *, folder: bool = True, hint: str = ""
) -> Path:
    """``path`` as a Path when it exists (as a folder, with ``folder``); :class:`StorePathError` naming it
    when it is an object-store URL, does not exist (``hint`` then follows), or is a file where a folder
    is needed. A path that does not exist is never read as an empty store."""
    local = require_local(path, what)
    if not local.exists():
        raise StorePathError(f"{what} {local} does not exist" + (f": {hint}" if hint else ""))
    if folder and not local.is_dir():
        raise StorePathError(f"{what} {local} is a file, not a folder")
    return local
