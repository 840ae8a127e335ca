"""Short `tinkertrace demo` runs, on the built-in model and on SmolLM2 (`make smollm2`): summary table,
summary.json, metrics and the reward-curve PNG."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tinkertrace.online.addition_agent import addition_reward, addition_task
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
    # 4 groups of 4 at max staleness 1 (capacity 32), down to one step's 16 before the last step, so
    # no more rollouts were started than the run would train
    assert (gate["capacity"], gate["max_staleness"]) == (4 * 4, 0)
    assert not gate["enabled"]  # withdrawn when the trainer stopped
    assert gate["admitted"] >= summary["rollouts_sampled"] and gate["consumed"] >= summary["rollouts_trained"]
    assert (out / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(read_metrics(out / "train")) == 3
    # held-out score: measured on the served policy before the first step and after the last; the
    # identity task's headline is its mean reward (no reply is exactly right after a demo's steps)
    heldout = summary["heldout"]
    assert heldout["before"]["policy_version"] == 0 and heldout["after"]["policy_version"] == 3
    assert heldout["before"]["replies"] == 2 * 8  # two held-out questions, 8 samples each
    assert (heldout["headline"], heldout["correct"]) == ("mean_reward", "exactly 'I am tinkertrace.'")
    assert [q for q, _ in heldout["after"]["examples"]] == ["Tell me who you are.", "Who am I talking to?"]
    b, a = heldout["before"]["mean_reward"], heldout["after"]["mean_reward"]
    assert f"held-out mean reward {b:.3f} → {a:.3f} ({a - b:+.3f}); accuracy (exactly" in done.stdout
    assert done.stdout.index("held-out mean reward, before") < done.stdout.index("held-out accuracy, before")
    # the live view's last line ends before what follows (piped output: no terminal to redraw)
    assert "\nheld-out after training:" in done.stdout


@pytest.mark.timeout(660)
def test_demo_on_smollm2_trains_the_addition_task(tmp_path: Path) -> None:
    """`tinkertrace demo --model smollm2-135m-instruct`: the real model asked sums, two steps."""
    out = tmp_path / "demo"
    cmd = [
        sys.executable, "-m", "tinkertrace.cli.main", "demo", "--out", str(out), "--steps", "2",
        "--workers", "1", "--group-size", "4", "--max-seconds", "500", "--model", "smollm2-135m-instruct",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "task addition" in done.stdout and "reward" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["served_policy_version"] == 2
    assert summary["rollouts_trained"] >= 2 * 4
    assert (out / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = [json.loads(line) for line in (out / "agents" / "worker-0.jsonl").read_text().splitlines()]
    assert not [row for row in rows if "error" in row]
    for row in rows:  # each reply scored against its round's sum, sampled by a published version
        assert row["reward"] == addition_reward(row["reply"], addition_task(0, row["round"])["answer"])
        assert 1 <= row["completion_tokens"] <= 12 and row["policy_version"] in (0, 1, 2)
    assert any(row["policy_version"] >= 1 for row in rows)
    # the published versions hold the LoRA weights alone, not SmolLM2's merged weights (538 MB)
    saved = list((out / "engine").glob("*/sampler_weights/*/trainable.safetensors"))
    assert len(saved) == 2 and all(f.stat().st_size < 50e6 for f in saved)


def test_sync_demo_is_on_policy(tmp_path: Path) -> None:
    """`--sync`: every step trains rollouts sampled entirely by the policy it updates — every trained
    token 0 versions old, the sampler's logprobs equal to the trainer's (mismatch KL ~0), none dropped.
    With two optimiser steps a step (`--num-substeps 2`) too: the KL measures the step's start."""
    from rich.console import Console

    from tinkertrace.online.demo import run_demo
    from tinkertrace.online.settings import DemoSettings

    settings = DemoSettings(
        out=tmp_path / "sync", model="tinkertrace/tiny-chat:nano", steps=3, workers=2, group_size=4,
        max_seconds=120, sync=True, num_substeps=2,
    )  # fmt: skip
    summary = run_demo(settings, console=Console(file=io.StringIO()))
    assert summary["steps"] == 3 and summary["rollouts_dropped"]["stale"] == 0
    assert summary["admission"]["capacity"] == 4 * 4  # one step's rollouts: staleness 0
    assert summary["admission"]["group_size"] == 4  # admitted whole groups at a time
    for metrics in read_metrics(tmp_path / "sync" / "train"):
        assert metrics["offpolicy/token_age_0"] == metrics["env/all/total_ac_tokens"] > 0
        assert metrics["offpolicy/rollout_age_0"] == metrics["env/all/total_episodes"]
        assert abs(metrics["offpolicy/mismatch_kl"]) < 1e-4
        assert metrics["optim/substeps"] == min(2, metrics["data/num_datums"])
    off = summary["offpolicy"]
    assert off["token_age"]["1"] == 0 and off["mismatch_kl_max"] < 1e-4
    assert off["mismatch_kl_by_age"]["0"] < 1e-4 and off["mismatch_kl_by_age"]["1"] is None
