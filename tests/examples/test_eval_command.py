"""`tinkertrace eval` against the deterministic OpenAI test server: JSONL per rollout and pass@k."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tinkertrace.cli.main import app
from tinkertrace.testing.openai_server import ReplyRequest

AGENT_SOURCE = """
from openai import OpenAI

def tasks(split="test"):
    return [{"id": f"{split}-{i}", "want": str(i)} for i in range(3)]

def agent(task, *, base_url, model, api_key="EMPTY", temperature=1.0):
    if task["id"].endswith("2"):
        raise RuntimeError("agent bug on task 2")
    client = OpenAI(base_url=base_url, api_key=api_key)
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": task["want"]}], temperature=temperature
    )
    return 1.0 if reply.choices[0].message.content.endswith(task["want"] + "!") else 0.25
"""


def _answer_first_task_twice(counter: dict[str, int]):
    def respond(req: ReplyRequest) -> str:
        want = req.messages[-1]["content"]
        counter[want] = counter.get(want, 0) + 1
        # task "0": correct on the first two of its four samples; task "1": never correct
        return want + "!" if want == "0" and counter[want] <= 2 else "no"

    return respond


def test_eval_writes_jsonl_and_pass_at_k(openai_server, tmp_path: Path) -> None:
    source = tmp_path / "my_agent.py"
    source.write_text(AGENT_SOURCE)
    openai_server.options.responder = _answer_first_task_twice({})
    out = tmp_path / "results.jsonl"
    result = CliRunner().invoke(
        app,
        [
            "eval",
            f"{source}:agent",
            "--tasks",
            f"{source}:tasks",
            "--split",
            "test",
            "--samples-per-task",
            "4",
            "--k",
            "1,4",
            "--base-url",
            openai_server.base_url,
            "--model",
            "test-model",
            "--concurrency",
            "1",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 12
    assert {line["task_id"] for line in lines} == {"test-0", "test-1", "test-2"}
    failed = [line for line in lines if line["error"]]
    assert len(failed) == 4 and all("agent bug on task 2" in line["error"] for line in failed)
    assert sum(line["passed"] for line in lines) == 2
    summary = json.loads((tmp_path / "results.summary.json").read_text())
    # task 0: n=4, c=2; tasks 1 and 2: c=0.  pass@1 = (0.5+0+0)/3; pass@4 = (1+0+0)/3
    assert summary["pass_at_k"]["pass@1"] == pytest.approx(0.5 / 3)
    assert summary["pass_at_k"]["pass@4"] == pytest.approx(1 / 3)
    assert summary["rollouts"] == 12 and summary["failed_rollouts"] == 4
    assert "pass@4" in result.output


def test_eval_rejects_k_above_samples_and_bad_refs(tmp_path: Path) -> None:
    source = tmp_path / "a.py"
    source.write_text(AGENT_SOURCE)
    runner = CliRunner()
    common = ["--base-url", "http://127.0.0.1:9/v1", "--out", str(tmp_path / "r.jsonl")]
    too_big = runner.invoke(
        app, ["eval", f"{source}:agent", "--tasks", f"{source}:tasks", "-n", "2", "--k", "4", *common]
    )
    assert too_big.exit_code == 2 and "k values [4]" in too_big.output
    missing = runner.invoke(app, ["eval", f"{source}:nope", "--tasks", f"{source}:tasks", *common])
    assert missing.exit_code == 2 and "has no attribute 'nope'" in missing.output
    bad_k = runner.invoke(app, ["eval", f"{source}:agent", "--tasks", f"{source}:tasks", "--k", "x", *common])
    assert bad_k.exit_code != 0 and "--k" in bad_k.output


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--concurrency", "0"], "--concurrency must be at least 1"),
        (["--max-tasks", "0"], "--max-tasks must be at least 1"),
    ],
)
def test_eval_refuses_bad_settings_before_running(tmp_path: Path, args: list[str], problem: str) -> None:
    source = tmp_path / "my_agent.py"
    source.write_text(AGENT_SOURCE)
    out = tmp_path / "results.jsonl"
    command = ["eval", f"{source}:agent", "--tasks", f"{source}:tasks", "--out", str(out), *args]
    result = CliRunner().invoke(app, command, env={"COLUMNS": "300"})
    assert result.exit_code == 2
    assert problem in result.output
    assert not out.exists()
