"""Install by role: the core is what an agent needs to trace and export over OTLP; a command or an
option whose extra is missing names the extra to install."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tinkertrace import extras
from tinkertrace.testing.environments import require_built

ROOT = Path(__file__).resolve().parents[1]
AGENT_PYTHON = ROOT / ".venv-agents" / "bin" / "python"  # tinkertrace's core + [parquet] + openai-agents


def test_extras_are_read_from_the_package_metadata() -> None:
    declared = extras.extra_requirements()
    assert {"parquet", "grpc", "collector", "build", "serve", "train", "engine", "all"} <= set(declared)
    assert any(spec.startswith("torch") for spec in declared["engine"])
    assert extras.missing("all") == []  # this test environment has every extra


def test_a_missing_distribution_names_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    without_pyarrow = extras.installed() - {"pyarrow"}
    monkeypatch.setattr(extras, "installed", lambda: without_pyarrow)
    # pyarrow is in `parquet`, which `build` and `engine` include: all three report it
    for extra in ("parquet", "build", "engine"):
        assert extras.missing(extra) == ["pyarrow"]
    assert extras.missing("grpc") == []
    with pytest.raises(extras.MissingExtraError, match=r"needs the 'build' extra \(missing: pyarrow\).*"
                       r"pip install 'tinkertrace\[build\]'"):  # fmt: skip
        extras.require("build", "this")
    with pytest.raises(KeyError, match="no extra 'nope'"):
        extras.missing("nope")


def _agent_env(code: str) -> subprocess.CompletedProcess[str]:
    require_built(AGENT_PYTHON.exists(), "the agents' environment (.venv-agents)", "agents-env")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TINKERTRACE_")}
    return subprocess.run(
        [str(AGENT_PYTHON), "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env
    )


def test_an_agent_environment_traces_without_the_heavy_packages() -> None:
    """In an environment of the core and [parquet] only, tracing to a collector loads none of numpy,
    pyarrow, grpc, duckdb, transformers or torch, and the collector command names its extra."""
    done = _agent_env(
        "import sys, tinkertrace\n"
        "tinkertrace.init(endpoint='http://127.0.0.1:9')\n"
        "heavy = {'numpy', 'pyarrow', 'grpc', 'duckdb', 'transformers', 'torch'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n"
        "tinkertrace.shutdown()\n"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
    cli = _agent_env("from tinkertrace.cli.main import app; app(['collector', '--out', 'unused'])")
    assert cli.returncode == 2
    assert "`tinkertrace collector` needs the 'collector' extra" in cli.stderr
    assert "pip install 'tinkertrace[collector]'" in cli.stderr


def test_eval_against_an_endpoint_needs_only_the_parquet_extra(tmp_path: Path) -> None:
    """`tinkertrace eval --base-url` runs in an environment of the core and [parquet] (an agent's own);
    without --base-url it would serve the model itself, and names the `serve` extra."""
    (tmp_path / "agent.py").write_text(
        "def play(task, *, base_url, model, api_key, **sampling):\n"
        "    assert base_url == 'http://127.0.0.1:9/v1'\n"
        "    return float(int(task['id']) % 2)\n"
        "def load_tasks(split):\n"
        "    return [{'id': i} for i in range(4)]\n"
    )
    agent = tmp_path / "agent.py"
    out = tmp_path / "results.jsonl"
    args = f"eval {agent}:play --tasks {agent}:load_tasks -n 2 --k 1,2 --out {out}".split()
    endpoint = ["--base-url", "http://127.0.0.1:9/v1"]
    done = _agent_env(f"from tinkertrace.cli.main import app; app({args + endpoint!r})")
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(out.with_name("results.summary.json").read_text())
    assert (summary["tasks"], summary["rollouts"], summary["pass_at_k"]["pass@2"]) == (4, 8, 0.5)
    local = _agent_env(f"from tinkertrace.cli.main import app; app({args!r})")
    assert local.returncode == 2
    assert "`tinkertrace eval` without --base-url needs the 'serve' extra" in local.stderr
