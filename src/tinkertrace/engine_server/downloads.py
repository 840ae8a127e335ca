"""Signed download URLs for exported weights, as Tinker hands them out.

The SDK (``RestClient.get_external_weights_urls``) asks for one URL per file of an
``external_weights`` checkpoint and fetches each with a plain GET, without the API key, like a
signed storage URL. Here a URL names the file and an expiry time, signed with an HMAC key that
lives only as long as the server process: ``/api/v1/downloads/<run>/<name>/<file>?expires=&signature=``.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from pathlib import Path
from urllib.parse import quote

from tinkertrace.engine.storage import META_FILE

DOWNLOADS_PREFIX = "/api/v1/downloads/"
URL_LIFETIME_S = 3600


def export_files(folder: Path) -> list[str]:
    """The downloadable files of an export folder, relative to it (the engine's own metadata left out)."""
    files = (f.relative_to(folder).as_posix() for f in folder.rglob("*") if f.is_file())
    return sorted(f for f in files if f != META_FILE)


class DownloadSigner:
    """Signs and checks download URLs with a key made at start (URLs die with the process)."""

    def __init__(self, lifetime_s: int = URL_LIFETIME_S) -> None:
        self._key = secrets.token_bytes(32)
        self.lifetime_s = lifetime_s

    def _signature(self, run_id: str, name: str, file: str, expires: int) -> str:
        message = f"{run_id}\n{name}\n{file}\n{expires}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def urls(self, base_url: str, run_id: str, name: str, files: list[str]) -> tuple[dict[str, str], int]:
        """``{file: URL}`` for each of ``files`` (paths relative to the export), and when they expire."""
        expires = int(time.time()) + self.lifetime_s
        urls = {}
        for rel in files:
            signature = self._signature(run_id, name, rel, expires)
            path = f"{DOWNLOADS_PREFIX}{quote(run_id)}/{quote(name)}/{quote(rel)}"
            urls[rel] = f"{base_url.rstrip('/')}{path}?expires={expires}&signature={signature}"
        return urls, expires

    def check(self, run_id: str, name: str, file: str, expires: str, signature: str) -> str | None:
        """None when the URL is genuine and unexpired, else why it is refused."""
        if not expires.isdigit() or not signature:
            return "download URL lacks its expires/signature parameters"
        if not hmac.compare_digest(self._signature(run_id, name, file, int(expires)), signature):
            return "download URL signature does not match (URLs die when the engine restarts)"
        if int(expires) < time.time():
            return "download URL has expired: ask for new ones (get_external_weights_urls)"
        return None
