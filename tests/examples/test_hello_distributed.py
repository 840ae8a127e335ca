"""The hello README's distributed form, as separate processes started the way the README starts them:
collector, `tinkertrace serve --admin-token`, `tinkertrace train --follow --publish-url`, and
`examples/hello/worker.py`. A step is trained and the endpoint's policy version moves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tinkertrace.netutil import free_ports, wait_for_port

HELLO = Path(__file__).resolve().parents[2] / "examples" / "hello"
TINKERTRACE = str(Path(sys.executable).with_name("tinkertrace"))
MODEL = "tinkertrace/tiny-chat:nano"


def _served_version(base: str) -> int:
    reply = httpx.post(
        f"{base}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "Who are you?"}], "max_tokens": 2},
        timeout=60,
    )
    reply.raise_for_status()
    return int(reply.headers["x-tinkertrace-policy-version"])


@pytest.mark.slow
def test_hello_distributed_form_trains_and_publishes(tmp_path: Path) -> None:
    env = {**os.environ, "TINKERTRACE_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
    otlp, port = free_ports(2)
    base = f"http://127.0.0.1:{port}"
    logs = {name: (tmp_path / f"{name}.log").open("wb") for name in ("collector", "serve", "train", "worker")}

    def start(name: str, *cmd: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=logs[name], stderr=subprocess.STDOUT)

    procs = [
        start(
            "collector",
            TINKERTRACE,
            "collector",
            "--out",
            "spans/",
            "--http-port",
            str(otlp),
            "--no-grpc",
            "--roll-seconds",
            "0.5",
        ),
        start(
            "serve",
            TINKERTRACE,
            "serve",
            "--backend",
            "local",
            "--model",
            MODEL,
            "--port",
            str(port),
            "--admin-token",
            "secret",
        ),
    ]
    try:
        wait_for_port(otlp, timeout=60)
        wait_for_port(port, timeout=60)
        assert _served_version(base) == 0
        trainer = start(
            "train", TINKERTRACE, "train", "spans/", "--follow", "--backend", "local", "--model", MODEL,
            "--group-size", "4", "--groups-per-batch", "2", "--max-steps", "1", "--lora-rank", "2",
            "--keep-constant-reward-groups", "--log-dir", "runs/hello-follow", "--no-progress",
            "--publish-url", base, "--publish-token", "secret",
        )  # fmt: skip
        procs.append(trainer)
        procs.append(
            start(
                "worker",
                sys.executable,
                str(HELLO / "worker.py"),
                "--base-url",
                f"{base}/v1",
                "--collector",
                f"http://127.0.0.1:{otlp}",
                "--model",
                MODEL,
            )
        )
        assert trainer.wait(timeout=150) == 0, (tmp_path / "train.log").read_text()[-3000:]
        records = (tmp_path / "runs/hello-follow/checkpoints.jsonl").read_text().splitlines()
        last = json.loads(records[-1])
        assert last["mode"] == "follow" and last["policy_version"] == 1
        assert len(last["trained_rollout_ids"]) >= 4
        deadline = time.monotonic() + 30
        while _served_version(base) < 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _served_version(base) == 1
        gate = httpx.get(f"{base}/health", timeout=10).json()["admission"]
        # the trainer's demand: 2 groups of 4; staleness 4, but its one step trains one step's worth
        assert (gate["capacity"], gate["max_staleness"]) == (2 * 4, 0)
        assert gate["consumed"] >= len(last["trained_rollout_ids"])  # reported with the version
        assert not gate["enabled"]  # withdrawn when the trainer stopped
        assert "round 0:" in (tmp_path / "worker.log").read_text() or procs[-1].poll() is None
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT if proc is procs[-1] else signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for handle in logs.values():
            handle.close()
