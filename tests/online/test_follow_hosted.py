"""`tinkertrace train --follow --backend tinker`: follow mode through the unchanged ``tinker`` SDK,
against a real `tinkertrace engine` process (``TINKER_BASE_URL`` + a dummy key), publishing each
version to an endpoint that samples through the SDK too (`serve --backend tinker`'s admin API)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tinker
from openai import OpenAI

from tinkertrace.engine_server.process import EngineProcess
from tinkertrace.netutil import BackgroundServer
from tinkertrace.online.runner import OnlineStack
from tinkertrace.serving.app import create_app
from tinkertrace.serving.policy import policy_from_service
from tinkertrace.testing.tinker_heartbeats import heartbeating_sessions, wait_heartbeats_stopped
from tinkertrace.training.checkpoints import read_checkpoints
from tinkertrace.training.metrics import read_metrics

from .conftest import MODEL, make_rollouts

pytestmark = pytest.mark.slow


def test_follow_mode_trains_through_the_tinker_sdk(
    stack: OnlineStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_rollouts(stack, "h", groups=2)
    log_dir = tmp_path / "follow-hosted"
    beating = heartbeating_sessions()
    with EngineProcess(tmp_path / "engine") as engine:
        monkeypatch.setenv("TINKER_API_KEY", engine.api_key)  # opens the sampler handles the trainer sends
        service = tinker.ServiceClient(base_url=engine.url)
        holder = policy_from_service(service, MODEL)
        endpoint = BackgroundServer(create_app(holder, admin_token="adm")).start()
        cmd = [
            sys.executable, "-m", "tinkertrace.cli.main", "train", str(stack.settings.spans_dir), "--follow",
            "--backend", "tinker", "--log-dir", str(log_dir), "--model", MODEL, "--lora-rank", "4",
            "--group-size", "4", "--groups-per-batch", "1", "--poll-seconds", "0.2", "--no-progress",
            "--max-staleness", "1000", "--learning-rate", "1e-3", "--keep-constant-reward-groups",
            "--idle-timeout", "4", "--staleness-mode", "correct",
            "--publish-url", endpoint.url, "--publish-token", "adm",
        ]  # fmt: skip
        env = {**os.environ, **engine.env(), "TINKERTRACE_CPU_THREADS": "1"}
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
            # the trainer's session has ended (and its inflight clients with it): the endpoint still answers
            chat = OpenAI(base_url=endpoint.url + "/v1", api_key="unused", max_retries=0)
            hi = [{"role": "user", "content": "hi"}]
            after = chat.chat.completions.create(model=MODEL, messages=hi, max_tokens=4)  # type: ignore[arg-type]
        finally:
            endpoint.stop()
            service.close("success").result(timeout=30)
        assert done.returncode == 0, done.stderr[-2000:]
        # the endpoint's inflight clients of the trainer's session share a shadow holder that beats on
        # until the engine answers 410 for the finished session: wait for it while the engine runs
        wait_heartbeats_stopped(heartbeating_sessions() - beating)
    assert not heartbeating_sessions() - beating, "a Tinker SDK heartbeat outlived its engine"
    records = read_checkpoints(log_dir)
    assert [r["step"] for r in records] == list(range(1, len(records) + 1)) and len(records) >= 2
    assert all(r["sampler_path"].startswith("tinker://") and ":train:" in r["sampler_path"] for r in records)
    run_id = records[-1]["sampler_path"].split("/")[2]
    assert (engine.engine_dir / run_id / "sampler_weights" / records[-1]["name"]).is_dir()
    assert len({rid for r in records for rid in r["trained_rollout_ids"]}) == 2 * 4
    assert all(m["loss:sum"] == m["loss:sum"] for m in read_metrics(log_dir))  # finite, logged per step
    # the corrected mode's extra forward pass went through the SDK too: its figures are logged
    assert all(0 <= m["offpolicy/truncated_frac"] <= 1 for m in read_metrics(log_dir))
    # every version reached the endpoint as a Tinker inflight client, then the last one came back as
    # the snapshot at its path when the trainer stopped
    assert holder.sampler_kind == "inflight" and holder.swaps == len(records) + 1
    served = holder.current()
    assert (served.version, served.model_path) == (records[-1]["policy_version"], records[-1]["sampler_path"])
    assert type(served.sampling_client) is tinker.SamplingClient and not served.inflight
    assert after.model_extra["policy_version"] == records[-1]["policy_version"]
