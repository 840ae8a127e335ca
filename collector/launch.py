"""Starting the collector as a process of its own, and knowing when it answers.

One command line for every caller (the demo stack, tests, benchmarks): ``tinkertrace collector``
run by this interpreter, writing to ``out`` and listening on ``http_port`` of loopback.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import httpx


def collector_command(out: str | Path, http_port: int, *options: str) -> list[str]:
    """The command that runs the collector with ``options`` (any of ``tinkertrace collector``'s)."""
    base = [sys.executable, "-m", "tinkertrace.cli.main", "collector", "--out", str(out)]
    return [*base, "--http-port", str(http_port), *options]


def wait_until_healthy(process: subprocess.Popen[Any], port: int, timeout: float) -> None:
    """Return once the collector started as ``process`` answers its health check on ``port``.

    RuntimeError if it exits first (say, another server took the port: that one's answers do not
    count), TimeoutError after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while process.poll() is None:
        try:
            if "pending_bytes" in httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json():
                return  # the collector's own health document
        except (httpx.HTTPError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"no collector answered on port {port} after {timeout:.0f}s")
        time.sleep(0.1)
    raise RuntimeError(f"the collector exited with code {process.returncode}")


@contextmanager
def running_collector(
    out: str | Path, http_port: int, *options: str, output: int | IO[Any] = subprocess.DEVNULL
) -> Iterator[str]:
    """A collector process (``options``: any of ``tinkertrace collector``'s) for the ``with`` block, its
    output to ``output``; yields its OTLP/HTTP URL, and stops it (it flushes) at the end."""
    command = collector_command(out, http_port, *options)
    proc = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    try:
        wait_until_healthy(proc, http_port, timeout=120)
        yield f"http://127.0.0.1:{http_port}"
    finally:
        proc.terminate()
        proc.wait(timeout=60)
