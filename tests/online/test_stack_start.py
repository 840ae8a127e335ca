"""Starting the online stack: the collector it waits for must be its own process, not whatever
answers on the port (a port race once sent every span to the policy endpoint)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from tinkertrace.collector.launch import collector_command, wait_until_healthy
from tinkertrace.netutil import BackgroundServer, free_ports


def _collector(out: Path, port: int, **popen: object) -> subprocess.Popen[bytes]:
    command = collector_command(out, port)
    return subprocess.Popen([*command, "--no-grpc"], **popen)  # type: ignore[call-overload]


def test_free_ports_are_different_and_free() -> None:
    ports = free_ports(50)
    assert len(set(ports)) == 50


def test_a_collector_that_cannot_bind_its_port_is_an_error_even_if_another_server_answers(
    tmp_path: Path,
) -> None:
    async def health(request: object) -> JSONResponse:
        return JSONResponse({"status": "ok"})  # another server's health check

    with BackgroundServer(Starlette(routes=[Route("/health", health)])) as other:
        output = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}
        collector = _collector(tmp_path / "spans", other.port, **output)
        with pytest.raises(RuntimeError, match="exited with code"):
            wait_until_healthy(collector, other.port, timeout=60)
        assert b"address already in use" in collector.stdout.read()  # type: ignore[union-attr]


def test_the_collector_is_recognised_by_its_health_document(tmp_path: Path) -> None:
    (port,) = free_ports(1)
    collector = _collector(tmp_path / "spans", port, stdout=subprocess.DEVNULL)
    try:
        wait_until_healthy(collector, port, timeout=60)
        assert collector.poll() is None
    finally:
        collector.terminate()
        collector.wait(timeout=30)
