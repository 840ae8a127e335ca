"""The views a user reaches for next: a rollout's group (attempts, rewards, advantages side by side),
reward by policy version, and downloads of the list (CSV, JSONL) and of a trajectory (JSON), each
checked against the run's own files."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from tinkertrace import schemas
from tinkertrace.training.dataset import prepare
from tinkertrace.ui.server import UiServer

from .conftest import Run, rollout_spans

pytestmark = pytest.mark.slow  # the session's run is traced and trained first


def test_group_view_shows_each_attempt_with_the_trainers_advantage(run: Run, ui: UiServer, page: Any) -> None:
    built = pq.read_table(run.log_dir / "build" / "trajectories.parquet")
    data = prepare(built, remove_constant_reward_groups=False)  # the trainer's own computation
    advantage = dict(zip(data.table["rollout_id"].to_pylist(), data.advantage_of_row.tolist(), strict=True))
    task = built.filter(pc.equal(built["task_id"], "task-3"))
    group = sorted(task["rollout_id"].to_pylist())
    assert len(group) == 3
    page.goto(ui.url + f"rollouts/{group[0]}")
    rows = page.locator("#group tbody tr")
    assert sorted(r.get_attribute("data-rollout") for r in rows.all()) == group
    assert page.locator("#group tbody tr.here").get_attribute("data-rollout") == group[0]
    for row in rows.all():
        rid = row.get_attribute("data-rollout")
        assert float(row.locator(".group-advantage").inner_text()) == pytest.approx(advantage[rid], abs=1e-4)
    rewards = {r["rollout_id"]: r["reward"] for r in task.select(["rollout_id", "reward"]).to_pylist()}
    assert sorted(float(t) for t in page.locator("#group tbody td:nth-child(4)").all_inner_texts()) == sorted(
        rewards.values()
    )


def test_reward_by_policy_version_matches_the_spans(run: Run, ui: UiServer, page: Any) -> None:
    glob = str(run.spans / "**" / "*.parquet")
    expected = duckdb.sql(
        f"""
        WITH s AS (SELECT * FROM read_parquet('{glob}')),
        r AS (SELECT rollout_id, min(policy_version) FILTER (WHERE span_type = 'llm') AS version,
                     sum(reward_value) FILTER (WHERE span_type = 'reward') AS reward
              FROM s WHERE rollout_id IS NOT NULL GROUP BY 1)
        SELECT version, count(*), avg(reward) FROM r GROUP BY 1 ORDER BY 1 NULLS FIRST
        """
    ).fetchall()
    page.goto(ui.url)
    rows = page.locator("#by-version tbody tr")
    assert rows.count() == len(expected)
    for row, (version, count, mean) in zip(rows.all(), expected, strict=True):
        cells = row.locator("td").all_inner_texts()
        assert cells[0] == (str(version) if version is not None else "–")
        assert int(cells[1]) == count and float(cells[3]) == pytest.approx(mean, rel=1e-3)
    if expected[-1][0] is not None:  # each version links to its rollouts
        page.locator("#by-version tbody tr").last.locator("a").click()
        page.wait_for_url(re.compile(r"version="))
        assert int(page.locator("#total").inner_text()) == expected[-1][1]


def test_the_list_and_a_trajectory_download(run: Run, ui: UiServer, page: Any) -> None:
    page.goto(ui.url + "rollouts?outcome=trained&sort=reward&per_page=25")
    total = int(page.locator("#total").inner_text())
    assert total > 25  # more than one page: the download holds every page
    with page.expect_download() as download:
        page.locator("#export-csv").click()
    rows = list(csv.DictReader(io.StringIO(download.value.path().read_text())))
    params = {"outcome": "trained", "sort": "reward", "per_page": 200}
    listed = httpx.get(ui.url + "api/rollouts", params=params)
    assert [r["rollout_id"] for r in rows] == [r["rollout_id"] for r in listed.json()["rows"]]
    assert len(rows) == total and {r["outcome"] for r in rows} == {"trained"}
    jsonl = httpx.get(ui.url.rstrip("/") + page.locator("#export-jsonl").get_attribute("href"))
    lines = [json.loads(line) for line in jsonl.text.splitlines()]
    assert [r["rollout_id"] for r in lines] == [r["rollout_id"] for r in rows]

    page.goto(ui.url + f"trajectory/{run.split_rollout}")
    body = httpx.get(ui.url.rstrip("/") + page.locator("#trajectory-json").get_attribute("href")).json()
    built = pq.read_table(run.log_dir / "build" / "trajectories.parquet").select(["rollout_id", "tokens"])
    tokens = [t for r in built.to_pylist() if r["rollout_id"] == run.split_rollout for t in r["tokens"]]
    assert [t["id"] for s in body["trajectory"]["segments"] for t in s["tokens"]] == tokens
    assert body["trajectory"]["trained_tokens"] == int(page.locator("#trained-count").inner_text())


def test_two_attempts_side_by_side_mark_where_they_diverge(run: Run, ui: UiServer, page: Any) -> None:
    """Turn by turn against the built triplets: same ids are 'same tokens'; the first turn whose ids
    differ is marked 'diverged here'."""
    triplets = pq.read_table(run.log_dir / "build" / "triplets.parquet").select(
        ["rollout_id", "turn", "prompt_token_ids", "response_token_ids"]
    )
    calls = {}
    for t in triplets.to_pylist():
        calls.setdefault(t["rollout_id"], {})[t["turn"]] = (t["prompt_token_ids"], t["response_token_ids"])
    # from the split rollout's group view, compare with its sibling
    page.goto(ui.url + f"rollouts/{run.split_rollout}")
    page.locator("#group a.compare").first.click()
    page.wait_for_url(re.compile(r"/compare\?"))
    sibling = re.search(r"b=([0-9a-f]+)", page.url).group(1)  # type: ignore[union-attr]
    rows = page.locator("#turns tbody tr")
    assert rows.count() == len(calls[run.split_rollout]) == 3
    for row in rows.all():
        turn = int(row.get_attribute("data-turn"))
        same = calls[run.split_rollout][turn] == calls[sibling][turn]
        assert (row.get_attribute("data-differs") == "same") == same
    # a rollout of another task: the prompts differ from the first turn on
    page.goto(ui.url + f"compare?a={run.split_rollout}&b={run.script_rollout}")
    first = page.locator("#turns tbody tr").first
    assert first.get_attribute("class") == "turn diverged"
    a = calls[run.split_rollout][0][0]
    b = calls[run.script_rollout][0][0]
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    assert first.locator(".agreement").inner_text() == f"diverged here: prompt differs from token {at} on"
    assert page.locator("#turns tbody tr.diverged").count() == 1
    assert (
        page.locator("#turns tbody tr").nth(1).locator(".agreement").inner_text() == "only one made this call"
    )
    assert httpx.get(ui.url + "compare?a=x").status_code == 400


def test_a_token_leads_to_its_call_and_colours_by_logprob(run: Run, ui: UiServer, page: Any) -> None:
    triplets = pq.read_table(run.log_dir / "build" / "triplets.parquet").to_pylist()
    span_of_turn = {t["turn"]: t["span_id"] for t in triplets if t["rollout_id"] == run.split_rollout}
    page.goto(ui.url + f"trajectory/{run.split_rollout}")
    token = page.locator(".segment").first.locator(".tok.trained").last
    token.click()
    span = span_of_turn[int(token.get_attribute("data-turn"))]
    link = page.locator("#token-span")
    assert link.inner_text() == f" · call span {span}"
    page.locator("#colour-by").select_option("logprob")
    assert token.evaluate("t => t.style.background") != ""
    assert page.locator(".tokens .tok:not(.sampled)").first.evaluate("t => t.style.background") == ""
    link.click()
    page.wait_for_url(re.compile(r"/rollouts/.*#span-"))
    assert page.locator(f"#span-{span}").count() == 1


def test_reward_by_version_per_environment(run: Run, tmp_path: Path, page: Any) -> None:
    """With environments in config.json, each version's reward is split by environment (the task id's
    part before its first '/', as training groups them), checked against the spans."""
    root = tmp_path / "envs"
    shutil.copytree(run.spans, root / "spans")
    shutil.copytree(run.log_dir, root / "train")
    config = json.loads((root / "train" / "config.json").read_text())
    config["environments"] = [{"name": "task-3"}, {"name": "split-task"}]
    (root / "train" / "config.json").write_text(json.dumps(config))
    glob = str(run.spans / "**" / "*.parquet")
    expected = duckdb.sql(
        f"""
        WITH r AS (SELECT rollout_id, min(task_id) AS task,
                          sum(reward_value) FILTER (WHERE span_type = 'reward') AS reward
                   FROM read_parquet('{glob}') WHERE rollout_id IS NOT NULL GROUP BY 1)
        SELECT CASE WHEN task IN ('task-3', 'split-task') THEN task END AS env, count(*), avg(reward)
        FROM r GROUP BY 1 ORDER BY 1 NULLS LAST
        """
    ).fetchall()
    with UiServer([root], refresh_s=0.2) as server:
        page.goto(server.url)
        rows = page.locator("#by-version tbody tr")
        shown = [(r.locator(".env").inner_text(), r.locator("td").nth(2).inner_text(),
                  r.locator("td").nth(4).inner_text()) for r in rows.all()]  # fmt: skip
    assert len(shown) == len(expected) == 3
    for (env_shown, n, mean_shown), (env, count, mean) in zip(shown, expected, strict=True):
        assert (env_shown, int(n)) == (env or "–", count)
        assert float(mean_shown) == pytest.approx(mean, rel=1e-3)


def _versioned_run(folder: Path) -> None:
    """Rollouts in our SDK's span form, sampled by policy versions 0 and 3, with known rewards."""
    plan = {"t-up": [(0, 0.0), (0, 0.0), (3, 1.0), (3, 1.0)], "t-down": [(0, 1.0), (3, 0.0)],
            "t-flat": [(0, 0.5), (3, 0.5)], "t-once": [(0, 0.2)]}  # fmt: skip
    attempts = [(task, version, reward) for task, runs in plan.items() for version, reward in runs]
    rows = [row for n, one in enumerate(attempts, 1) for row in rollout_spans(f"r{n}", f"{n:x}", *one)]
    part = folder / "date=2026-11-27" / "hour=10"
    part.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schemas.spans()), part / "run.parquet")


def test_tasks_whose_reward_moved_between_versions(tmp_path: Path, page: Any) -> None:
    _versioned_run(tmp_path / "run" / "spans")
    with UiServer([tmp_path / "run"], refresh_s=0.2) as server:
        page.goto(server.url)
        rows = page.locator("#task-progress tbody tr")
        shown = [(r.get_attribute("data-task"), r.locator(".change").inner_text()) for r in rows.all()]
        assert shown == [("t-down", "-1"), ("t-up", "+1"), ("t-flat", "+0")]  # t-once: one version only
        versions = page.locator("#by-version tbody tr")
        assert [r.locator("td").first.inner_text() for r in versions.all()] == ["0", "3"]
        assert [r.locator("td").nth(3).inner_text() for r in versions.all()] == ["0.34", "0.625"]
