"""Run ``tinkertrace engine`` as a child process on a free loopback port (tests, benchmarks, examples)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tinkertrace.netutil import free_port


class EngineProcess:
    """``with EngineProcess(tmp / "engine") as engine: engine.url`` — a real ``tinkertrace engine``.

    ``env()`` gives the variables that point the ``tinker`` SDK (and ``tinkertrace train --backend
    tinker``) at it. The child is stopped (SIGTERM, then SIGKILL) on exit; its output goes to
    ``log_file`` (default ``<engine_dir>/engine.log``).
    """

    def __init__(
        self,
        engine_dir: Path,
        *,
        api_key: str = "tml-tinkertrace-local",
        require_key: bool = False,
        cpu_threads: int | None = 1,
        extra_args: list[str] | None = None,
        log_file: Path | None = None,
        start_timeout_s: float = 120.0,
    ) -> None:
        self.engine_dir = Path(engine_dir)
        self.api_key = api_key
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_file = log_file or self.engine_dir / "engine.log"
        self._args = ["--port", str(self.port), "--dir", str(self.engine_dir), *(extra_args or [])]
        if require_key:
            self._args += ["--api-key", api_key]
        if cpu_threads is not None:
            self._args += ["--cpu-threads", str(cpu_threads)]
        self._timeout = start_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None

    def env(self) -> dict[str, str]:
        """``TINKER_BASE_URL`` and ``TINKER_API_KEY`` for a Tinker client of this engine."""
        return {"TINKER_BASE_URL": self.url, "TINKER_API_KEY": self.api_key}

    def start(self) -> EngineProcess:
        self.engine_dir.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "tinkertrace.cli.main", "engine", *self._args]
        with open(self.log_file, "ab") as log:
            self._proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
        deadline = time.monotonic() + self._timeout
        while True:
            if self._proc.poll() is not None:
                output = self.log_file.read_text()[-2000:]
                raise RuntimeError(f"tinkertrace engine exited with {self._proc.returncode}: {output}")
            try:
                if httpx.get(self.url + "/api/v1/healthz", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"tinkertrace engine did not answer on {self.url} in {self._timeout:.0f}s")
            time.sleep(0.1)

    def stop(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=15)

    def __enter__(self) -> EngineProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
