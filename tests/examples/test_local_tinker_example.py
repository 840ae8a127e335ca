"""examples/local_tinker/quickstart.py, written only against the public tinker SDK, runs unchanged
against a real `tinkertrace engine` process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tinkertrace.engine_server.process import EngineProcess

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "local_tinker" / "quickstart.py"


@pytest.mark.slow
def test_quickstart_trains_samples_and_resumes_against_the_engine(tmp_path: Path) -> None:
    with EngineProcess(tmp_path / "engine") as engine:
        env = {**os.environ, **engine.env(), "TINKERTRACE_CPU_THREADS": "1"}
        done = subprocess.run(
            [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path
        )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    losses = out["losses"]
    assert losses[-1] < 0.2 * losses[0]  # it learned the answer
    assert out["answer"] == "Paris"
    assert out["state_path"].startswith("tinker://") and out["state_path"].endswith("/weights/halfway")
    # The resumed run continues from the halfway state: its loss is that of step STEPS // 2.
    assert out["resumed_loss"] == pytest.approx(losses[len(losses) // 2], rel=1e-5)
