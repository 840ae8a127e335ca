"""A signal ends `tinkertrace train --config` (agents run here) within seconds, mid-episode, before any
step: the workers abandon their groups in flight instead of finishing them (ORS episodes, and a sync
agent's rollouts that cannot be cancelled), every ORS session the run opened is deleted (the server's
own count of sessions is 0 afterwards), and the spans the collector had written before the signal are
still there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import httpx
import pytest

from tinkertrace.spanstore.reader import open_spans
from tinkertrace.testing.waiting import wait_until

from .conftest import OrsServer, start_ors_server

NANO = "tinkertrace/tiny-chat:nano"
STOP_BOUND_S = 10.0
"""The signal-to-exit bound the test holds: the target is 5 s (measured 1.5-3 s on the 2-core VM), with
room for a loaded machine; before this change it took 20 s or more (the workers' groups were waited for)."""


@pytest.fixture(scope="module")
def session_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OrsServer]:
    server = start_ors_server(tmp_path_factory.mktemp("ors") / "server.log", script="session_server.py")
    yield server
    server.stop()


def open_sessions(server: OrsServer) -> int:
    """The sessions the ORS server holds (created, not deleted)."""
    return int(httpx.get(server.url + "/health/sessions", timeout=5).json()["open"])


def span_ids(spans: Path) -> set[str]:
    """The span ids in the collector's finished files."""
    with duckdb.connect() as con:
        open_spans(con, spans)
        return {row[0] for row in con.execute("select span_id from spans").fetchall()}


NAP = """
import time
from pathlib import Path


def nap(task, **settings):
    Path(__file__).with_name("napping").touch()
    time.sleep(600)  # a sync agent: its thread cannot be cancelled
    return 0.0


def tasks(split="train"):
    return [{"id": "a"}, {"id": "b"}]
"""


def config_file(server: OrsServer, log: Path) -> Path:
    """whodunit episodes (up to 8 policy calls of up to 512 tokens), ``slow`` ones (their prompt never
    comes in time) and a sync agent's that sleep, 12 groups a step: no step forms before the signal.
    Each worker takes the environments in turn: worker 0 starts whodunit and slow, worker 1 slow and
    nap."""
    (log.parent / "nap.py").write_text(NAP)
    path = log.parent / "config.yaml"
    path.write_text(
        f"model_name: {NANO}\nlora_rank: 2\nbatch_size: 12\nlog_path: {log}\nenvironments:\n"
        f"  {server.url}/whodunit: {{num_rollouts: 3, max_turns: 8}}\n"
        f"  {server.url}/slow: {{num_rollouts: 2}}\n"
        "  nap: {agent: nap.py:nap, tasks: nap.py:tasks, num_rollouts: 2}\n"
    )
    return path


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_ends_the_run_within_seconds_and_closes_its_sessions(
    session_server: OrsServer, tmp_path: Path, signum: signal.Signals
) -> None:
    log = tmp_path / "run"
    env = {**os.environ, "TINKER_API_KEY": "", "OPENREWARD_API_KEY": ""}
    config = config_file(session_server, log)
    command = [sys.executable, "-m", "tinkertrace.cli.main", "train", "--config", str(config), "--workers=2"]
    out = (tmp_path / "train.log").open("wb")
    run = subprocess.Popen([*command, "--no-progress"], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        # both workers have both their groups under way (3 + 2 + 2 open sessions, a sync agent asleep),
        # and the policy has answered: spans are written
        def under_way() -> bool:
            asleep = (tmp_path / "napping").exists()
            return asleep and open_sessions(session_server) >= 7 and bool(span_ids(log / "spans"))

        wait_until(lambda: run.poll() is not None or under_way(), 300, "episodes under way")
        assert run.poll() is None, (tmp_path / "train.log").read_text()[-3000:]
        written = span_ids(log / "spans")
        started = time.monotonic()
        run.send_signal(signum)
        code = run.wait(timeout=120)
        elapsed = time.monotonic() - started
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    output = (tmp_path / "train.log").read_text()
    print(f"{signum.name}: the run ended {elapsed:.1f} s after the signal")
    assert code == 0, output[-3000:]
    assert elapsed <= STOP_BOUND_S, f"{elapsed:.1f} s:\n{output[-3000:]}"
    assert "Traceback" not in output  # the endpoint's requests the agents abandoned fail quietly
    assert open_sessions(session_server) == 0
    assert written <= span_ids(log / "spans")
    assert json.loads((log / "summary.json").read_text())["steps"] == 0  # Ctrl-C stops as SIGTERM does
