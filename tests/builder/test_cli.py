"""`tinkertrace build-trajectories` and `tinkertrace spans query` end to end on SDK-written spans."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import tinkertrace
from tinkertrace import schemas
from tinkertrace.cli.main import app


@pytest.fixture
def spans(tmp_path: Path, openai_server: Any) -> Path:
    """Two SDK rollouts (one of two turns) against the test server, written by the embedded sink."""
    folder = tmp_path / "spans"
    tinkertrace.init(spans_dir=folder)
    client = openai.OpenAI(base_url=openai_server.base_url, api_key="test")

    @tinkertrace.traced_rollout
    def solve(task: dict[str, Any]) -> float:
        msgs: list[dict[str, Any]] = []
        for q in task["qs"]:
            msgs.append({"role": "user", "content": q})
            reply = client.chat.completions.create(model="test-model", messages=msgs)
            msgs.append({"role": "assistant", "content": reply.choices[0].message.content})
        return float(len(task["qs"]))

    solve({"id": "one", "qs": ["a"]})
    solve({"id": "two", "qs": ["a", "b"]})
    tinkertrace.shutdown()
    bad = folder / "date=2026-01-01" / "hour=00" / "bad.parquet"
    bad.parent.mkdir(parents=True, exist_ok=True)
    bad.write_bytes(b"not parquet at all")
    return folder


def test_build_trajectories_command(spans: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["build-trajectories", str(spans), "-o", str(out), "--reward-policy", "final"]
    )
    assert result.exit_code == 0, result.output
    assert "rollouts built" in result.output and "skipped corrupt file" in result.output
    trip = pq.read_table(out / "triplets.parquet")
    traj = pq.read_table(out / "trajectories.parquet")
    assert trip.schema.equals(schemas.triplets()) and traj.schema.equals(schemas.trajectories())
    assert trip.column("reward").to_pylist() == [1.0, 2.0, 2.0] or trip.column("reward").to_pylist() == [
        2.0,
        2.0,
        1.0,
    ]
    assert sorted(traj.column("num_turns").to_pylist()) == [1, 2]
    assert sorted(traj.column("group_key").to_pylist()) == ["one", "two"]


def flat(text: str) -> str:
    """Output without whitespace and box drawing (rich wraps messages to the terminal width)."""
    return "".join(ch for ch in text if not ch.isspace() and ch not in "│╭╮╰╯─")


def test_build_trajectories_rejects_bad_input(spans: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(app, ["build-trajectories", str(tmp_path / "nope"), "-o", str(tmp_path / "o")])
    assert missing.exit_code != 0 and "doesnotexist" in flat(missing.output)
    policy = runner.invoke(
        app, ["build-trajectories", str(spans), "-o", str(tmp_path / "o"), "--reward-policy", "x"]
    )
    assert policy.exit_code == 2 and "--reward-policy:'x'isnotoneof" in flat(policy.output)
    since = runner.invoke(
        app, ["build-trajectories", str(spans), "-o", str(tmp_path / "o"), "--since", "yesterday"]
    )
    assert since.exit_code != 0 and "notanISO-8601" in flat(since.output)


def test_spans_query_formats(spans: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    sql = "SELECT task_id, count(*) AS calls FROM llm_calls GROUP BY ALL ORDER BY 1"
    table = runner.invoke(app, ["spans", "query", str(spans), sql])
    assert table.exit_code == 0, table.output
    assert "one" in table.output and "two" in table.output and "skipped" in table.output
    as_json = runner.invoke(app, ["spans", "query", str(spans), sql, "--format", "json"])
    lines = [json.loads(line) for line in as_json.output.splitlines() if line.startswith("{")]
    assert lines == [{"task_id": "one", "calls": 1}, {"task_id": "two", "calls": 2}]
    as_csv = runner.invoke(app, ["spans", "query", str(spans), sql, "-f", "csv"])
    assert "task_id,calls\none,1\ntwo,2\n" in as_csv.output
    target = tmp_path / "rollouts.parquet"
    pq_run = runner.invoke(
        app,
        [
            "spans",
            "query",
            str(spans),
            "SELECT * FROM rollouts ORDER BY task_id",
            "-f",
            "parquet",
            "-o",
            str(target),
        ],
    )
    assert pq_run.exit_code == 0, pq_run.output
    rollouts = pq.read_table(target)
    assert rollouts.column("task_id").to_pylist() == ["one", "two"]
    assert rollouts.column("incomplete_reason").to_pylist() == [None, None]
    bad = runner.invoke(app, ["spans", "query", str(spans), "SELECT nope FROM spans"])
    assert bad.exit_code == 2 and "nope" in bad.output


def test_build_status_filter_and_bad_status(spans: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    ok = CliRunner().invoke(app, ["build-trajectories", str(spans), "-o", str(out), "--status", "failed"])
    assert ok.exit_code == 0, ok.output
    assert "rollouts left out by status" in ok.output
    assert pq.read_table(out / "triplets.parquet").num_rows == 0  # both rollouts succeeded
    bad = CliRunner().invoke(app, ["build-trajectories", str(spans), "-o", str(out), "--status", "oops"])
    assert bad.exit_code == 2 and "--status must be among" in bad.output
