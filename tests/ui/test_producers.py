"""One definition of a rollout: the ui lists the rollouts of other producers' spans (Agent-lightning,
a plain GenAI trace with no rollout id) exactly as the builder's own ``rollouts`` relation makes them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tinkertrace import schemas
from tinkertrace import semconv as sc
from tinkertrace.builder.query import open_views
from tinkertrace.ui.server import UiServer

from .conftest import span

pytestmark = pytest.mark.slow  # a browser


def write_foreign_run(folder: Path) -> None:
    """Two Agent-lightning rollouts (rollout id in the resource) and one plain GenAI trace."""
    rows = []
    for i, reward in ((1, 1.0), (2, 0.0)):
        resource = {sc.AGL_ROLLOUT_ID: f"agl-{i}", sc.AGL_ATTEMPT_ID: "0"}
        llm = {sc.AGL_PROMPT_TOKEN_IDS: [1, 2, 3], sc.AGL_RESPONSE_TOKEN_IDS: [4, 5]}
        rows += [
            span(f"a{i}", "1", "openai.chat.completion", 1, attributes=llm, resource_attributes=resource),
            span(
                f"a{i}",
                "2",
                sc.AGL_REWARD_SPAN,
                3,
                attributes={"reward": reward},
                resource_attributes=resource,
            ),
        ]
    rows += [
        span("p1", "1", "chat_session", 0, attributes={sc.TASK_ID: "plain-task"}),
        span("p1", "2", "chat gpt", 1, parent="1", attributes={sc.GENAI_OPERATION: "chat"}),
    ]
    part = folder / "date=2026-11-27" / "hour=10"  # as the collector writes
    part.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schemas.spans()), part / "foreign.parquet")


def test_other_producers_rollouts_are_listed_as_the_builder_makes_them(tmp_path: Path, page: Any) -> None:
    spans = tmp_path / "run" / "spans"
    write_foreign_run(spans)
    con = duckdb.connect()
    open_views(con, spans)
    expected = con.execute(
        "SELECT rollout_id, task_id, COALESCE(status, 'unknown'), incomplete_reason FROM rollouts ORDER BY 1"
    ).fetchall()
    assert len(expected) == 3  # two Agent-lightning rollouts and the plain trace
    with UiServer([tmp_path / "run"], refresh_s=0.2) as server:
        page.goto(server.url + "rollouts?sort=rollout_id&order=asc")
        assert page.locator("#total").inner_text() == "3"
        shown = page.locator("#rollout-table tbody tr")
        assert [r.get_attribute("data-rollout") for r in shown.all()] == [e[0] for e in expected]
        body = page.request.get(server.url + "api/rollouts?sort=rollout_id&order=asc").json()
        listed = [(r["rollout_id"], r["task_id"], r["status"], r["incomplete"]) for r in body["rows"]]
        assert listed == expected
        assert {r["rollout_id"]: r["reward"] for r in body["rows"]}["agl-1"] == 1.0
        page.goto(server.url + "rollouts/agl-1")
        assert page.locator("#timeline .span-row").count() == 2
        assert page.locator("#calls tbody tr").count() == 1  # the builder made its call
