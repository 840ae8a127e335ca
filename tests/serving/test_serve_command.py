"""`tinkertrace serve` as a user runs it: a real process, the real OpenAI client, an admin swap."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
from typer.testing import CliRunner

from tinkertrace.cli.main import app
from tinkertrace.engine import ServiceClient
from tinkertrace.models.tokenizer import BUILTIN_MODEL
from tinkertrace.netutil import free_port, wait_for_port


@pytest.mark.slow
def test_serve_command_answers_the_openai_client_and_swaps_by_admin_call(tmp_path: Path) -> None:
    engine_dir = tmp_path / "engine"
    trainer = ServiceClient(base_dir=engine_dir, device="cpu").create_lora_training_client(
        BUILTIN_MODEL, rank=2
    )
    sampler_path = trainer.result().save_weights_for_sampler("v7").result().path
    port = free_port()
    cmd = [sys.executable, "-m", "tinkertrace.cli.main", "serve", "--port", str(port), "--api-key", "k-1"]
    cmd += ["--admin-token", "adm", "--engine-dir", str(engine_dir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port(port, timeout=60)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k-1", max_retries=0)
        resp = client.chat.completions.create(
            model=BUILTIN_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5
        )
        assert len(resp.choices[0].model_extra["token_ids"]) <= 5 and resp.model_extra["policy_version"] == 0
        chunks = list(client.completions.create(model=BUILTIN_MODEL, prompt="a", max_tokens=3, stream=True))
        assert sum(len(c.choices[0].model_extra["token_ids"]) for c in chunks if c.choices) <= 3
        swap = httpx.post(
            f"http://127.0.0.1:{port}/admin/policy",
            json={"model_path": sampler_path, "version": 7},
            headers={"Authorization": "Bearer adm"},
            timeout=60,
        )
        assert swap.status_code == 200, swap.text
        resp = client.completions.create(model=BUILTIN_MODEL, prompt="a", max_tokens=2)
        assert resp.model_extra["policy_version"] == 7
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
    assert f"http://127.0.0.1:{port}/v1" in stderr and "API key required" in stderr  # the start-up line


def test_serve_command_reports_a_missing_model_clearly(tmp_path: Path) -> None:
    args = ["serve", "--model", str(tmp_path / "nope"), "--engine-dir", str(tmp_path / "engine")]
    result = CliRunner().invoke(app, [*args, "--port", str(free_port())])
    assert result.exit_code == 1
    assert "cannot start" in result.stderr and "nope" in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)  # no traceback


def test_serve_help_names_the_tool_parsers_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    help_text = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"}).output
    for name in ("hermes", "qwen", "none", "auto", "/v1/responses"):
        assert name in help_text
    result = CliRunner().invoke(app, ["serve", "--tool-parser", "mistral", "--port", str(free_port())])
    assert result.exit_code == 2 and "--tool-parser" in result.output
