"""A producer is one adapter: a new one, added to the registry in a test, is read through every view
(its spans, process-level rollout and attempt, agent spans, finish reason, reward dimensions and
completeness), and the core views name no producer."""

from __future__ import annotations

import inspect
from pathlib import Path

import duckdb
import pytest

from tinkertrace import semconv as sc
from tinkertrace.builder import adapters, build_trajectories, stages, views
from tinkertrace.builder.adapters import Adapter
from tinkertrace.builder.query import open_views
from tinkertrace.spanstore.sql import attr

from .conftest import SpanRows

_LLM = "name = 'acme.llm'"
ACME = Adapter(
    name="acme",
    match="name IN ('acme.llm', 'acme.score')",
    columns={
        "span_type": f"CASE WHEN {_LLM} THEN '{sc.TYPE_LLM}' ELSE '{sc.TYPE_REWARD}' END",
        "prompt_token_ids": f"TRY_CAST({attr('acme.prompt')} AS INTEGER[])",
        "response_token_ids": f"TRY_CAST({attr('acme.response')} AS INTEGER[])",
        "reward_value": f"TRY_CAST({attr('acme.value')} AS DOUBLE)",
    },
    finish_reasons=(attr("acme.stop"),),
    dimensions=f"TRY_CAST(TRY_CAST({attr('acme.dims')} AS JSON) AS MAP(VARCHAR, DOUBLE))",
    rollout_id=attr("acme.run", "resource_attributes"),
    attempt=f"TRY_CAST({attr('acme.try', 'resource_attributes')} AS INTEGER)",
    completeness_record=False,
    agent_name=attr("acme.agent"),
)
RESOURCE = {"acme.run": "run-7", "acme.try": "3"}


@pytest.fixture
def acme(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adapters, "ADAPTERS", (*adapters.ADAPTERS, ACME))


def _write(folder: Path, rows: SpanRows) -> None:
    agent = rows.span(trace="a", name="planner", start=0, end=50, resource=RESOURCE,
                      attributes={"acme.agent": "planner"})  # fmt: skip
    ids = {"acme.prompt": "[1, 2]", "acme.response": "[3]", "acme.stop": "length"}
    rows.span(trace="a", name="acme.llm", start=1, end=2, parent=agent, resource=RESOURCE, attributes=ids)
    rows.span(trace="a", name="acme.score", start=3, end=3, parent=agent, resource=RESOURCE,
              attributes={"acme.value": 0.5, "acme.dims": '{"speed": 0.25}'})  # fmt: skip
    rows.write(folder)


def test_a_new_producer_is_one_adapter(tmp_path: Path, rows: SpanRows, acme: None) -> None:
    _write(tmp_path, rows)
    result = build_trajectories(tmp_path)
    (triplet,) = result.triplets.to_pylist()
    assert (triplet["rollout_id"], triplet["attempt"], triplet["agent_name"]) == ("run-7", 3, "planner")
    assert (triplet["prompt_token_ids"], triplet["response_token_ids"]) == ([1, 2], [3])
    assert (triplet["truncated"], triplet["reward"]) == (True, 0.5)
    assert result.summary.llm_spans_by_producer == {"acme": 1}
    con = duckdb.connect()
    open_views(con, tmp_path)
    assert con.execute("SELECT uncounted, incomplete_reason FROM rollouts").fetchall() == [(True, None)]
    assert con.execute("SELECT dimensions FROM rewards").fetchall() == [({"speed": 0.25},)]


def test_without_its_adapter_the_producer_is_unrecognised(tmp_path: Path, rows: SpanRows) -> None:
    _write(tmp_path, rows)
    result = build_trajectories(tmp_path)
    assert result.triplets.num_rows == 0
    assert result.summary.spans_by_producer == {"unrecognised": 3}


def test_the_core_views_name_no_producer() -> None:
    source = inspect.getsource(views) + inspect.getsource(stages)
    named = [a.name for a in adapters.ADAPTERS if f"'{a.name}'" in source]  # as a SQL literal
    words = ("agentlightning", "agent_lightning", "openllmetry", "invoke_agent")
    named += [w for w in words if w in source.lower()]
    assert not named, f"views.py / stages.py name producers {named}: their adapters declare it"
