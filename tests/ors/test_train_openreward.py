"""The OpenReward trainer's config file run by `tinkertrace train --config` against the example's real
ORS server, on the nano built-in model, shortened with `--set`: two follow steps over both
environments (no --follow: with no source the file runs its environments' agents, as that trainer
does), then batch mode over the spans it left, and `resume_from` a state it saved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tinker import types

from tinkertrace.engine import ServiceClient
from tinkertrace.netutil import free_port
from tinkertrace.training.checkpoints import read_checkpoints
from tinkertrace.training.metrics import read_metrics

from .conftest import OrsServer

NANO = "tinkertrace/tiny-chat:nano"
CONFIG = Path(__file__).resolve().parents[2] / "examples" / "openreward" / "tinker-config.yaml"
SHORT = [
    *("--set", f"model_name={NANO}", "--set", "lora_rank=2", "--set", "batch_size=2"),
    *("--set", "environments.whodunit.num_rollouts=2", "--set", "environments.arithmetic.num_rollouts=2"),
    *("--set", "environments.whodunit.max_turns=2", "--set", "environments.arithmetic.max_turns=1"),
    *("--keep-constant-reward-groups", "--no-progress"),
]

SHORT_FOLLOW = ("--max-steps", "1", "--workers", "2", "--group-timeout", "60", "--max-seconds", "300")


def probe_logprobs(client: Any) -> list[float]:
    """Log-probabilities a sampling client gives a fixed token sequence."""
    return client.compute_logprobs(types.ModelInput.from_ints(list(range(3, 40)))).result()[1:]


def train(ors: OrsServer, log: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """`tinkertrace train --config CONFIG` (shortened) with OPENREWARD_URL at ``ors`` and no Tinker key."""
    env = {**os.environ, "OPENREWARD_URL": ors.url, "TINKER_API_KEY": "", "OPENREWARD_API_KEY": ""}
    command = [sys.executable, "-m", "tinkertrace.cli.main", "train", "--config", str(CONFIG), *SHORT]
    return subprocess.run(
        [*command, "--set", f"log_path={log}", *extra], capture_output=True, text=True, timeout=420, env=env
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_config_file_trains_both_environments_then_batch_and_resume(
    ors_server: OrsServer, tmp_path: Path
) -> None:
    run = tmp_path / "follow"
    done = train(ors_server, run, "--max-steps", "2", *SHORT_FOLLOW[2:])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "backend local engine (auto: no TINKER_API_KEY)" in done.stderr
    assert "W&B project 'tinker-test' configured but the wandb package is not installed" in done.stderr
    assert (
        "openreward_run_name is set but OPENREWARD_API_KEY is not: rollouts are not uploaded" in done.stderr
    )
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["agent_errors"] == []
    for name in ("whodunit", "arithmetic"):
        assert summary["environments"][name]["rollouts"] >= 2 and summary["environments"][name]["failed"] == 0
    episodes = [
        sum(m[f"env/{n}/total_episodes"] for m in read_metrics(run)) for n in ("whodunit", "arithmetic")
    ]
    assert min(episodes) >= 2  # both environments trained in one run
    config = json.loads((run / "config.json").read_text())
    assert (config["loss"], config["groups_per_batch"], config["backend"]) == ("ppo", 2, "local")

    # batch mode over the spans it left; cross_entropy, so the weights move whatever the rewards
    engine = ("--engine-dir", str(tmp_path / "engine"))
    imitate = ("--set", "loss_fn=cross_entropy", "--set", "batch_size=8", *engine)  # 8 groups a step
    batch = train(ors_server, tmp_path / "batch", str(run / "spans"), *imitate)
    assert batch.returncode == 0, batch.stderr[-3000:]
    fresh = read_metrics(tmp_path / "batch")
    assert len(fresh) >= 1 and fresh[0]["env/all/total_episodes"] >= 2

    state = read_checkpoints(tmp_path / "batch")[-1]["state_path"]
    resumed = train(
        ors_server, tmp_path / "resumed", str(run / "spans"), *imitate, "--set", f"resume_from={state}"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    loaded = read_metrics(tmp_path / "resumed")
    # the same first rows, other starting weights (the saved state's): other logprobs
    assert fresh[0]["optim/kl_sample_train_v1"] != loaded[0]["optim/kl_sample_train_v1"]
    # follow mode from that state: the endpoint serves the resumed weights from its start, not the base
    follow = train(
        ors_server, tmp_path / "follow-resumed", *SHORT_FOLLOW, *engine, "--set", f"resume_from={state}"
    )
    assert follow.returncode == 0, follow.stderr[-3000:]
    started = json.loads((tmp_path / "follow-resumed" / "summary.json").read_text())["start_weights"]
    saved = read_checkpoints(tmp_path / "batch")[-1]["sampler_path"]
    service = ServiceClient(base_dir=tmp_path / "engine")
    served, resumed_lp, base = (
        probe_logprobs(service.create_sampling_client(**where))
        for where in ({"model_path": started}, {"model_path": saved}, {"base_model": NANO})
    )
    # one cross_entropy step at the config's lr 1e-5 moves these logprobs by ~1e-4..1e-3 (measured)
    moved = max(abs(s - b) for s, b in zip(served, base, strict=True))
    assert served == pytest.approx(resumed_lp, abs=1e-5) and moved > 5e-5, moved

    wrong = train(
        ors_server,
        tmp_path / "wrong",
        str(run / "spans"),
        "--set",
        "resume_from=tinker://nope/weights/x",
        *engine,
    )
    assert wrong.returncode == 2 and "tinker://nope/weights/x" in wrong.stderr


def test_an_unreachable_server_is_one_clear_error_at_start(tmp_path: Path) -> None:
    dead = OrsServer(f"http://127.0.0.1:{free_port()}", None, tmp_path / "none.log")  # type: ignore[arg-type]
    done = train(dead, tmp_path / "run", "--max-steps", "1")
    assert done.returncode == 2
    assert (
        "environment 'whodunit' (openreward 'whodunit'): ORS server" in done.stderr
        and "unreachable" in done.stderr
    )
