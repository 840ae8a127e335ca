"""A collector started as a real subprocess on free loopback ports."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest

from tinkertrace.collector.launch import collector_command, wait_until_healthy
from tinkertrace.netutil import free_ports, wait_for_port
from tinkertrace.spanstore.reader import open_spans


@dataclass
class CollectorProcess:
    out: Path
    http_port: int
    grpc_port: int
    args: list[str]
    env: dict[str, str] | None = None  # added to this process's environment
    proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/v1/traces"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self) -> CollectorProcess:
        command = collector_command(self.out, self.http_port, "--grpc-port", str(self.grpc_port))
        command += ["--instance", "test", *self.args]
        env = {**os.environ, **(self.env or {})}
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        try:
            wait_until_healthy(self.proc, self.http_port, timeout=60)
            wait_for_port(self.grpc_port, timeout=60)
        except (TimeoutError, RuntimeError):  # never leave a collector running behind a failed test
            self.kill()
            raise
        return self

    def stop(self) -> str:
        """SIGTERM, wait, and return everything the collector printed."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        output, _ = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, output
        return output

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()  # SIGKILL: no flushing at all
        self.proc.communicate(timeout=30)

    def query(self, sql: str) -> list[tuple]:
        con = duckdb.connect()
        report = open_spans(con, self.out)
        assert report.skipped == []
        return con.execute(sql).fetchall()


@pytest.fixture
def start_collector(tmp_path: Path) -> Iterator[Callable[..., CollectorProcess]]:
    """``start_collector(*extra_args)`` starts a collector writing to ``tmp_path/spans``."""
    started: list[CollectorProcess] = []

    def start(*args: str, out: Path | None = None, env: dict[str, str] | None = None) -> CollectorProcess:
        collector = CollectorProcess(out or tmp_path / "spans", *free_ports(2), list(args), env)
        started.append(collector.start())
        return collector

    yield start
    for collector in started:
        if collector.proc is not None and collector.proc.poll() is None:
            collector.proc.kill()
            collector.proc.communicate(timeout=30)
