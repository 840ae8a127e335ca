"""A real ``openreward`` Server on a free loopback port, started in its own venv (.venv-openreward)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tinkertrace.netutil import free_port
from tinkertrace.testing.environments import require_built
from tinkertrace.testing.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
ORS_PYTHON = ROOT / ".venv-openreward" / "bin" / "python"
require_built(
    ORS_PYTHON.exists(), "the OpenReward example's environment (.venv-openreward)", "openreward-env"
)


@dataclass
class OrsServer:
    """A running ORS server process: ``url`` (no trailing slash), its process and log."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def start_ors_server(log: Path, *args: str, script: str = "ors_server.py") -> OrsServer:
    """tests/ors/``script`` (ors_server.py: the example's environments and ``faulty``) on a free port,
    healthy."""
    port = free_port()
    command = [str(ORS_PYTHON), str(Path(__file__).parent / script), "--port", str(port), *args]
    process = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    server = OrsServer(f"http://127.0.0.1:{port}", process, log)
    try:
        wait_until(lambda: process.poll() is not None or _healthy(server.url), 60, "the ORS server answers")
        if process.poll() is not None:
            raise RuntimeError(f"the ORS server exited: {log.read_text()[-2000:]}")
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture(scope="module")
def ors_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OrsServer]:
    server = start_ors_server(tmp_path_factory.mktemp("ors") / "server.log")
    yield server
    server.stop()
