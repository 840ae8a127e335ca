"""A short `tinkertrace demo` run: summary table, summary.json, metrics and the reward-curve PNG."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tinkertrace.training.metrics import read_metrics

pytestmark = pytest.mark.slow


def test_short_demo_writes_summary_metrics_and_png(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    cmd = [
        sys.executable, "-m", "tinkertrace.cli.main", "demo", "--out", str(out), "--steps", "3",
        "--workers", "2", "--group-size", "4", "--max-seconds", "90", "--model", "tinkertrace/tiny-chat:nano",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "summary" in done.stdout and "reward" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3 and len(summary["rewards_per_step"]) == 3
    assert summary["rollouts_trained"] >= 3 * 4
    assert summary["served_policy_version"] == 3  # every step was published to the endpoint
    assert summary["completions_per_s"] > 0
    # every sampled rollout is counted once: trained, dropped (by reason) or in flight at the end
    dropped = summary["rollouts_dropped"]
    assert summary["rollouts_sampled"] == (
        summary["rollouts_trained"] + dropped["stale"] + dropped["constant_reward"]
        + summary["rollouts_in_flight_at_end"]
    )  # fmt: skip
    gate = summary["admission"]  # the endpoint admitted rollouts by the trainer's demand
    assert gate["capacity"] == 4 * 4 * 2  # 4 groups of 4, max staleness 1
    assert not gate["enabled"]  # withdrawn when the trainer stopped
    assert gate["admitted"] >= summary["rollouts_sampled"] and gate["consumed"] >= summary["rollouts_trained"]
    assert (out / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(read_metrics(out / "train")) == 3
