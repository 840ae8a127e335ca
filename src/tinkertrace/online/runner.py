"""The online loop's moving parts on one machine: collector, sampling endpoint, agent workers.

:class:`OnlineStack` starts the collector as a subprocess (``tinkertrace collector``, OTLP/HTTP on a
free loopback port, Parquet files rolled every ``roll_seconds``), serves the policy in-process
(``serving.create_app`` over a :class:`PolicyHolder` on the local engine, in a background uvicorn
thread), and starts agent worker subprocesses that call the endpoint with the OpenAI client and send
their spans to the collector. The follow trainer publishes into ``stack.holder``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from tinkertrace.collector.launch import collector_command, wait_until_healthy
from tinkertrace.netutil import BackgroundServer, free_port
from tinkertrace.online.groups_in_flight import ABANDON_S, STOP_POLL_S
from tinkertrace.online.settings import StackSettings
from tinkertrace.serving.policy import InflightMode

WORKER_STOP_S = ABANDON_S + 2.0
"""How long a worker has after SIGTERM (to abandon its groups, close their sessions and send its spans)
before it is killed."""


def serve_policy(
    service: Any,
    model: str,
    max_tokens: int,
    *,
    model_path: str | None = None,
    version: int = 0,
    inflight: InflightMode = "keep-cache",
) -> tuple[Any, BackgroundServer]:
    """Serve ``model`` (or the sampler weights at ``model_path``, as ``version``) from ``service`` (a
    local-engine ``ServiceClient``): a ``PolicyHolder`` whose loader opens ``tinker://`` sampler
    paths, behind the OpenAI-compatible app in a started background uvicorn thread. Stop the
    returned server when done."""
    from tinkertrace.serving.app import create_app
    from tinkertrace.serving.policy import policy_from_service

    holder = policy_from_service(service, model, model_path=model_path, version=version, inflight=inflight)
    server = BackgroundServer(create_app(holder, default_max_tokens=max_tokens)).start()
    return holder, server


@contextmanager
def _unlogged_failures() -> Iterator[None]:
    """The endpoint logs no traceback for a request that fails meanwhile: while the stack stops, those
    are requests their agents abandoned, failed by the closing sampler (one traceback each was noise)."""
    from tinkertrace.serving.guard import log

    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


@dataclass
class OnlineStack:
    """Collector + endpoint + workers; use as a context manager (everything stops on exit)."""

    settings: StackSettings
    service: Any = None
    holder: Any = None
    collector_url: str = ""
    base_url: str = ""
    _collector: subprocess.Popen[bytes] | None = None
    _server: BackgroundServer | None = None
    _workers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self) -> OnlineStack:
        """Start the collector and the endpoint (not the workers)."""
        s = self.settings
        for folder in (s.spans_dir, s.agents_dir, s.engine_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self._start_endpoint()  # first: its port is taken before the collector's is chosen
        port = free_port()
        self._collector = subprocess.Popen(
            collector_command(s.spans_dir, port, "--no-grpc", "--roll-seconds", str(s.roll_seconds)),
            stdout=(s.out / "collector.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        self.collector_url = f"http://127.0.0.1:{port}"
        try:
            wait_until_healthy(self._collector, port, timeout=60)
        except (TimeoutError, RuntimeError) as exc:
            self.stop()
            log = (s.out / "collector.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the collector did not start on port {port} ({exc}):\n{log}") from None
        return self

    def _start_endpoint(self) -> None:
        from tinkertrace.engine import ServiceClient

        s = self.settings
        self.service = self.service or ServiceClient(base_dir=s.engine_dir)
        self.holder, self._server = serve_policy(
            self.service,
            s.model,
            s.max_tokens,
            model_path=s.model_path,
            version=s.policy_version,
            inflight=s.inflight,
        )
        self.base_url = self._server.url + "/v1"

    def start_workers(self, count: int) -> None:
        """Start ``count`` agent worker processes against the endpoint and the collector."""
        s = self.settings
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **s.worker_env}
        for i in range(len(self._workers), len(self._workers) + count):
            self._workers.append(
                subprocess.Popen(
                    [
                        s.worker_python,
                        "-m",
                        s.agent_module,
                        "--base-url",
                        self.base_url,
                        "--collector",
                        self.collector_url,
                        "--model",
                        s.model,
                        "--worker",
                        str(i),
                        "--log",
                        str(s.agents_dir / f"worker-{i}.jsonl"),
                        "--group-size",
                        str(s.group_size),
                        "--max-tokens",
                        str(s.max_tokens),
                        "--export-delay",
                        str(s.export_delay_s),
                        *s.worker_args,
                    ],
                    stdout=(s.agents_dir / f"worker-{i}.log").open("wb"),
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )

    def run_trainer(
        self,
        trainer: Any,
        *,
        workers: int,
        max_seconds: float | None,
        progress: bool = False,
        around: AbstractContextManager[Any] | None = None,
        stop: threading.Event | None = None,
        console: Any = None,
    ) -> Any:
        """Start ``workers`` agent workers, run ``trainer`` (a ``FollowTrainer``) until its step limit,
        ``max_seconds`` (None: no limit) or ``stop`` is set, then stop the workers; returns the trainer's
        result. ``around`` (e.g. a rich ``Live`` display) is entered for the duration of the training.
        Once ``stop`` is set the workers are stopped at once, while the trainer ends its step."""
        stop = stop or threading.Event()
        timer = threading.Timer(max_seconds if max_seconds is not None else 0, stop.set)
        timer.daemon = True
        ended = threading.Event()
        watcher = threading.Thread(
            target=self._stop_workers_on, args=(stop, ended), name="tt-stop", daemon=True
        )
        self.start_workers(workers)
        watcher.start()
        if max_seconds is not None:
            timer.start()
        try:
            with around if around is not None else nullcontext():
                return trainer.run(stop=stop, console=console, progress=progress)
        finally:
            timer.cancel()
            ended.set()
            watcher.join()
            self.stop_workers()

    def _stop_workers_on(self, stop: threading.Event, ended: threading.Event) -> None:
        """Stop the workers as soon as ``stop`` is set, unless ``ended`` is set first."""
        while not ended.is_set():
            if stop.wait(STOP_POLL_S):
                self.stop_workers()
                return

    def stop_workers(self, timeout: float = WORKER_STOP_S) -> None:
        """Ask every worker to stop (SIGTERM: an environment worker abandons its groups in flight, the
        demo's finishes its round), then kill any still running after ``timeout`` seconds."""
        for proc in self._workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self._workers:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def agent_results(self) -> list[dict[str, Any]]:
        """Every rollout line the workers logged (a line cut short by a killed worker is left out)."""
        from tinkertrace.training.jsonl import read_jsonl

        paths = sorted(self.settings.agents_dir.glob("worker-*.jsonl"))
        return [row for path in paths for row in read_jsonl(path, skip_bad=True)]

    def stop(self) -> None:
        """Stop workers, then the sampler and the endpoint, then the collector (SIGTERM: it flushes its
        files)."""
        self.stop_workers()
        with _unlogged_failures():
            if self.holder is not None:
                # first: the requests it still decodes (their agents are gone) fail now instead of holding
                # the endpoint's shutdown for its grace time; and no decoding thread may outlive the process
                self.holder.close()
            if self._server is not None:
                self._server.stop()
                self._server = None
        if self._collector is not None and self._collector.poll() is None:
            self._collector.send_signal(signal.SIGTERM)
            try:
                self._collector.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._collector.kill()
                self._collector.wait()

    def __enter__(self) -> OnlineStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
