"""tinker-cookbook 0.5.8's own RL loop (``tinker_cookbook.rl.train``) and supervised loop, unchanged,
against a real ``tinkertrace engine`` process.

The cookbook pins transformers <= 5.5.4, so it runs in its own environment (``.venv-cookbook``, built
by ``make cookbook-env``; it shares torch and the ``tinker`` SDK with ``.venv``). A recipe's model
name reaches the built-in model through ``--model-alias``; the cookbook loads the tokenizer through
its own ``register_tokenizer`` hook. A cookbook or SDK release that breaks compatibility fails here.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tinkertrace.engine_server.process import EngineProcess
from tinkertrace.models.tokenizer import load_tokenizer
from tinkertrace.testing.environments import require_built

from .conftest import NANO

ROOT = Path(__file__).resolve().parents[2]
COOKBOOK_PYTHON = ROOT / ".venv-cookbook" / "bin" / "python"
require_built(COOKBOOK_PYTHON.exists(), "tinker-cookbook's environment (.venv-cookbook)", "cookbook-env")

RECIPE_MODEL = "Qwen/Qwen3-8B-Base"


@pytest.mark.slow
def test_cookbook_rl_and_supervised_loops_run_unchanged(tmp_path: Path) -> None:
    tokenizer_folder = tmp_path / "tokenizer"
    load_tokenizer(NANO).save_pretrained(str(tokenizer_folder))
    alias = ["--model-alias", f"{RECIPE_MODEL}={NANO}"]
    with EngineProcess(tmp_path / "engine", extra_args=alias) as engine:
        env = {**os.environ, **engine.env(), "PYTHONPATH": ""}
        script = Path(__file__).with_name("cookbook_loops.py")
        done = subprocess.run(
            [str(COOKBOOK_PYTHON), str(script), RECIPE_MODEL, str(tokenizer_folder), str(tmp_path / "work")],
            env=env,
            capture_output=True,
            text=True,
            timeout=480,
        )
    assert done.returncode == 0, done.stderr[-4000:] + engine.log_file.read_text()[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])

    # RL: three iterations (two, then a resumed third), every one trained on sampled rollouts
    steps = [m for m in out["rl_metrics"] if "env/all/reward/total" in m]
    assert [m["progress/batch"] for m in steps] == [0, 1, 2]
    assert all(m["env/all/ac_tokens_per_turn"] > 0 for m in steps)
    # on-policy, the sampler's logprobs are the trainer's: the cookbook's KL estimate is ~0
    assert all(abs(m["optim/kl_sample_train_v1"]) < 1e-4 for m in steps)
    # the run keeps the renderer the cookbook stored, under the recipe's model name
    assert out["rl_run"]["metadata"]["renderer_name"] == "role_colon"
    assert out["rl_run"]["base"] == RECIPE_MODEL
    assert "Renderer metadata matches for checkpoint" in done.stderr  # read back when resuming
    assert "has no renderer metadata" not in done.stderr
    # rolling saves deleted the states they replaced (the cookbook's DELETE): the others are left
    rolling = {c["state_path"] for c in out["rl_checkpoints"] if c.get("rolling")}
    kept = {c["state_path"] for c in out["rl_checkpoints"] if not c.get("rolling")}
    assert len(rolling) == 2 and not rolling & set(out["rl_listed"])
    assert kept <= set(out["rl_listed"])

    # supervised: two epochs over four conversations in batches of two; the second epoch (the same
    # conversations) has a lower loss than the first
    losses = [m["train_mean_nll"] for m in out["sl_metrics"] if "train_mean_nll" in m]
    assert len(losses) == 4 and sum(losses[2:]) < sum(losses[:2])
    assert any(c["name"] == "final" for c in out["sl_checkpoints"])

    # weights.download of a training state: an age-encrypted export, downloaded and decrypted
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(out["exported"])
    log = engine.log_file.read_text()
    assert "Traceback" not in log
