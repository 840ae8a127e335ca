"""The settings of ``tinkertrace ui``, each declared once (the command's options come from them).

Light on purpose: the command line imports it to build its help.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from tinkertrace.settings import listen_host, listen_port, port_check, raise_problems, setting

TOKEN_ENV = "TINKERTRACE_UI_TOKEN"


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ui_url(host: str, port: int, token: str | None) -> str:
    """The address to open (with the token, which the app then keeps in a cookie)."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")


@dataclass
class UiSettings:
    """What the web app shows and where it listens."""

    paths: list[Path] = setting(
        help="Run folders (a demo's output, a training log folder, a build-trajectories output) or span "
        "folders. Default: the current folder.",
        argument=True,
        default_factory=list,
    )
    host: str = listen_host()
    port: int = listen_port(8400)
    token: str | None = setting(
        None,
        "Require this token on every request; required when --host is not a loopback address. Open the "
        "printed URL once: the browser then keeps it in a cookie.",
        envvar=TOKEN_ENV,
    )
    refresh_seconds: float = setting(1.0, "Look for new span files and steps at most this often.")
    memory_limit: str = setting("1GB", "DuckDB memory limit of the app's index.")

    @property
    def folders(self) -> list[Path]:
        """The folders to show: the paths given, else the current folder."""
        return self.paths or [Path.cwd()]

    def validate(self) -> UiSettings:
        """Check the folders exist and that a non-loopback address has a token; returns self."""
        missing = [str(p) for p in self.folders if not p.exists()]
        checks = [
            (not missing, f"{', '.join(missing)} does not exist"),
            (
                self.token is None or self.token.strip() != "",
                f"token is empty (--token or {TOKEN_ENV}): give a real token, or none on a loopback host",
            ),
            (
                is_loopback(self.host) or bool(self.token and self.token.strip()),
                f"listening on {self.host} (not loopback) needs --token (or {TOKEN_ENV}): span text is "
                "training data",
            ),
            (self.refresh_seconds >= 0.1, "refresh_seconds must be at least 0.1"),
            port_check(self.port),
        ]
        raise_problems(checks, "invalid ui settings")
        return self
