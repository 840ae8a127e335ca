"""Each token-free build stage (``builder/stages.py``, ``builder/event_rewards.py``) called on its own
over a spans folder of hand-made rows: what table it makes and which summary counts it fills."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest

from tinkertrace import semconv as sc
from tinkertrace.builder import BuildSettings, stages, views
from tinkertrace.builder.event_rewards import add_event_rewards
from tinkertrace.builder.sources import Sources, open_sources
from tinkertrace.builder.summary import BuildSummary

from .conftest import T0, SpanRows

AGL = {sc.AGL_ROLLOUT_ID: "agl-1", sc.AGL_ATTEMPT_ID: "2"}


class Built:
    """The stages run one by one over a written spans folder, on one connection."""

    def __init__(self, folder: Path, **options: Any) -> None:
        self.con = duckdb.connect()
        self.options = BuildSettings(**options)
        self.summary = BuildSummary()
        self.sources: Sources = open_sources(self.con, folder)
        typed = views.create_typed(self.con, self.sources.raw)
        self.view = views.create_spans(self.con, self.sources.raw, typed)

    def spans(self) -> str:
        return add_event_rewards(self.con, stages.spans(self.con, self.view, self.summary), self.sources)

    def upto_calls(self) -> tuple[str, str, str, str | None, str]:
        spans = self.spans()
        rollouts = stages.rollouts(self.con, spans, self.options, self.summary)
        scopes = stages.agent_scopes(self.con, spans, rollouts)
        parents = stages.parents(self.con, spans, rollouts, self.options, self.summary)
        calls = stages.calls(self.con, spans, rollouts, scopes, parents, self.summary)
        return spans, rollouts, scopes, parents, calls

    def rows(self, sql: str) -> list[dict[str, Any]]:
        result = self.con.execute(sql)
        names = [d[0] for d in result.description]
        return [dict(zip(names, row, strict=True)) for row in result.fetchall()]


def test_spans_are_token_free_and_counted_by_producer(tmp_path: Path, rows: SpanRows) -> None:
    root = rows.rollout("r1")
    ours = rows.llm("r1", root, [1, 2], [3], start=1, end=2)
    agl = rows.span(trace="r2", name="openai.chat.completion", start=1, end=2, resource=AGL,
                    attributes={sc.AGL_PROMPT_TOKEN_IDS: [1], sc.AGL_RESPONSE_TOKEN_IDS: [2]})  # fmt: skip
    tool = rows.span(trace="r2", name="tool", start=3, end=4, resource=AGL, attributes={"x": 1})
    plain = rows.span(trace="r3", name="unknown", start=0, end=1, attributes={"y": 1})
    rows.write(tmp_path)
    built = Built(tmp_path)
    table = stages.spans(built.con, built.view, built.summary)
    columns = {d[0] for d in built.con.execute(f"SELECT * FROM {table} LIMIT 0").description}
    assert not columns & {
        "prompt_token_ids",
        "response_token_ids",
        "response_logprobs",
        "resource_attributes",
    }
    got = built.rows(
        "SELECT span_id, producer, process_producer, rollout_id, attempt, attributes IS NOT NULL AS attrs, "
        f"filename IS NOT NULL AS has_file FROM {table}"
    )
    assert {r.pop("span_id"): tuple(r.values()) for r in got} == {
        ours: (None, None, "r1", None, False, True),  # ours: no producer to carry; its file kept
        agl: ("agentlightning", "agentlightning", "agl-1", 2, True, True),
        root: (None, None, "r1", 0, True, False),  # a root keeps its attributes (its counts)
        tool: ("unrecognised", "agentlightning", "agl-1", 2, True, False),  # its process's rollout
        plain: ("unrecognised", None, "r3".rjust(32, "0"), None, True, False),  # a plain trace's root
    }
    assert built.summary.spans == 5 and built.summary.spans_without_rollout == 0
    assert built.summary.spans_by_producer == {"tinkertrace": 2, "agentlightning": 1, "unrecognised": 2}
    assert built.summary.llm_spans_by_producer == {"tinkertrace": 1, "agentlightning": 1}


def test_event_rewards_are_reward_rows_under_their_span(tmp_path: Path, rows: SpanRows) -> None:
    root = rows.rollout("r1")
    event = {"name": sc.REWARD_SPAN_NAME, "time_unix_nano": T0 + 5_000_000,
             "attributes": json.dumps({sc.GENAI_EVALUATION_NAME: "accuracy", sc.GENAI_EVALUATION_SCORE: 0.75,
                                       sc.GENAI_RESPONSE_ID: "resp-1"})}  # fmt: skip
    call = rows.llm("r1", root, [1], [2], start=1, end=2, response_id="resp-1", events=json.dumps([event]))
    rows.write(tmp_path)
    built = Built(tmp_path)
    table = built.spans()
    (reward,) = built.rows(
        f"SELECT parent_span_id, span_id, reward_name, reward_value, response_id, rollout_id, task_id "
        f"FROM {table} WHERE span_type = '{sc.TYPE_REWARD}'"
    )
    assert (reward["parent_span_id"], reward["span_id"]) == (call, f"{call}/event1")
    assert (reward["reward_name"], reward["reward_value"], reward["response_id"]) == (
        "accuracy",
        0.75,
        "resp-1",
    )
    assert (reward["rollout_id"], reward["task_id"]) == ("r1", "t1")  # the carrier's rollout


def test_event_rewards_add_nothing_without_events(tmp_path: Path, rows: SpanRows) -> None:
    rows.llm("r1", rows.rollout("r1"), [1], [2], start=1, end=2)
    rows.write(tmp_path)
    built = Built(tmp_path)
    table = stages.spans(built.con, built.view, built.summary)
    assert add_event_rewards(built.con, table, built.sources) == table
    assert built.con.execute(f"SELECT count(*) FROM {table}").fetchall() == [(2,)]


def test_rollouts_are_filtered_and_each_filter_counted(tmp_path: Path, rows: SpanRows) -> None:
    rows.rollout("ok", task="a")
    rows.rollout("other-task", task="b")
    rows.rollout("eval", split="eval")
    rows.rollout("short", llm_calls=1)  # counts a call that never arrived
    rows.llm("gone", None, [1], [2], start=1, end=2)  # no root: root_missing
    rows.span(trace="old", name="root", start=0, end=1, span_type=sc.TYPE_ROLLOUT, rollout_id="old",
              task_id="a", attributes={sc.ROLLOUT_STATUS: sc.STATUS_FAILED})  # fmt: skip
    rows.write(tmp_path)
    built = Built(tmp_path, tasks=("a", "t1"), splits=("train",), exclude_rollouts={"old"})
    table = stages.rollouts(built.con, built.spans(), built.options, built.summary)
    s = built.summary
    assert (
        built.rows(f"SELECT rollout_id FROM {table}")
        == [{"rollout_id": "ok"}]
        == [{"rollout_id": r} for r in s.rollout_ids]
    )
    assert (s.rollouts_seen, s.rollouts_excluded, s.rollouts_filtered, s.rollouts_built) == (6, 1, 2, 1)
    assert s.rollouts_incomplete == {"missing_llm_spans": 1, "root_missing": 1}
    assert s.incomplete_rollout_ids == ["gone", "short"]


def test_rollouts_status_filter_and_failed_count(tmp_path: Path, rows: SpanRows) -> None:
    rows.rollout("good")
    rows.span(trace="bad", name="root", start=0, end=1, span_type=sc.TYPE_ROLLOUT, rollout_id="bad",
              task_id="t1", attributes={sc.ROLLOUT_STATUS: sc.STATUS_FAILED})  # fmt: skip
    rows.write(tmp_path)
    every = Built(tmp_path)
    stages.rollouts(every.con, every.spans(), every.options, every.summary)
    assert (every.summary.rollouts_built, every.summary.rollouts_failed) == (2, 1)
    good = Built(tmp_path, statuses=("succeeded",))
    stages.rollouts(good.con, good.spans(), good.options, good.summary)
    assert (good.summary.rollouts_built, good.summary.rollouts_status_filtered) == (1, 1)


def test_parents_repairs_orphans_by_time_for_sibling_only(tmp_path: Path, rows: SpanRows) -> None:
    root = rows.rollout("r1")
    step = rows.span(trace="r1", name="step", start=1, end=9, parent=root, rollout_id="r1")
    call = rows.llm("r1", "lost-parent", [1], [2], start=2, end=3)
    rows.write(tmp_path)
    for policy, table_made in (("nearest", False), ("sibling", True)):
        built = Built(tmp_path, reward_policy=policy)
        spans = built.spans()
        rollouts = stages.rollouts(built.con, spans, built.options, built.summary)
        parents = stages.parents(built.con, spans, rollouts, built.options, built.summary)
        assert built.summary.orphan_spans_repaired == 1
        assert (parents is not None) == table_made
    assert parents is not None
    assert built.rows(f"SELECT parent FROM {parents} WHERE span_id = '{call}'") == [{"parent": step}]


def test_agent_scopes_by_parent_chain_then_by_time(tmp_path: Path, rows: SpanRows) -> None:
    root = rows.rollout("r1")
    agent = rows.span(trace="r1", name="invoke_agent a", start=1, end=20, parent=root,
                      span_type=sc.TYPE_AGENT, rollout_id="r1", agent_name="a")  # fmt: skip
    step = rows.span(trace="r1", name="step", start=2, end=5, parent=agent, rollout_id="r1")
    nested = rows.llm("r1", step, [1], [2], start=3, end=4)
    bare = rows.llm("r1", None, [1], [2], start=6, end=7)  # a thread without context
    outside = rows.llm("r1", root, [1], [2], start=30, end=31)  # under the root, after the agent
    rows.write(tmp_path)
    built = Built(tmp_path)
    spans = built.spans()
    scopes = stages.agent_scopes(built.con, spans, stages.rollouts(built.con, spans, built.options,
                                                                   built.summary))  # fmt: skip
    got = {r["span_id"]: (r["scope"], r["scope_agent"]) for r in built.rows(f"SELECT * FROM {scopes}")}
    assert got == {nested: (agent, "a"), bare: (agent, "a")}
    assert outside not in got


def test_calls_are_distinct_and_numbered_by_time(tmp_path: Path, rows: SpanRows) -> None:
    root = rows.rollout("r1")
    second = rows.llm("r1", root, [1], [2], start=5, end=6, response_id="b")
    first = rows.llm("r1", root, [1], [2], start=1, end=4, response_id="a")
    rows.llm("r1", first, [1], [2], start=2, end=3)  # the same call's inner (HTTP-level) span
    rows.llm("r1", root, [], [], start=7, end=8)  # no ids: counted, not trainable
    rows.write(tmp_path)
    built = Built(tmp_path)
    *_, calls = built.upto_calls()
    got = built.rows(f"SELECT span_id, turn, trainable FROM {calls} ORDER BY turn")
    assert [(r["span_id"], r["turn"]) for r in got[:2]] == [(first, 0), (second, 1)]
    s = built.summary
    assert (s.llm_spans, s.llm_calls, s.llm_duplicates, s.llm_calls_without_tokens) == (4, 3, 1, 1)


def test_rewards_take_the_named_dimension(tmp_path: Path, rows: SpanRows) -> None:
    root = rows.rollout("r1")
    rows.reward("r1", root, 1.0, at=5, dims={"primary": 1.0, "style": 0.25})
    rows.reward("r1", root, 0.5, at=6)  # no "style" dimension
    rows.write(tmp_path)
    built = Built(tmp_path, reward_name="style")
    spans, rollouts, scopes, parents, _ = built.upto_calls()
    table = stages.rewards(built.con, spans, rollouts, scopes, parents, built.options, built.summary)
    assert built.rows(f"SELECT v FROM {table} ORDER BY start_time") == [{"v": 0.25}, {"v": None}]
    assert (built.summary.rewards, built.summary.rewards_missing_dimension) == (2, 1)


def _chosen(built: Built, buckets: int) -> list[dict[str, Any]]:
    *_, calls = built.upto_calls()
    built.con.execute(
        "CREATE TABLE assigned AS SELECT ''::VARCHAR AS call_trace_id, ''::VARCHAR AS call_span_id, "
        "0.0::DOUBLE AS v WHERE false"
    )
    table = stages.chosen_calls(built.con, calls, "assigned", built.options, built.summary, buckets)
    return built.rows(
        f"SELECT rollout_id, agent_name, group_key, call_no, bucket FROM {table} ORDER BY call_no"
    )


def test_chosen_calls_are_numbered_grouped_and_bucketed(tmp_path: Path, rows: SpanRows) -> None:
    for rollout, task in (("r2", "t1"), ("r1", "t2"), ("r3", "t1")):
        root = rows.rollout(rollout, task=task)
        for i in range(2):
            rows.llm(rollout, root, [1], [2], start=i, end=i + 0.5, agent=f"agent{i}", task=task)
    rows.write(tmp_path)
    chosen = _chosen(Built(tmp_path), buckets=3)
    assert [r["rollout_id"] for r in chosen] == ["r2", "r2", "r3", "r3", "r1", "r1"]  # by group, rollout
    assert [r["bucket"] for r in chosen] == [0, 0, 1, 1, 2, 2]  # equal-count ranges of call_no
    by_agent = _chosen(Built(tmp_path, group_by="task+agent", agent="agent1$"), buckets=1)
    assert [(r["rollout_id"], r["group_key"]) for r in by_agent] == [
        ("r1", "t2::agent1"), ("r2", "t1::agent1"), ("r3", "t1::agent1")
    ]  # fmt: skip


def test_chosen_calls_reject_a_bad_agent_expression(tmp_path: Path, rows: SpanRows) -> None:
    rows.llm("r1", rows.rollout("r1"), [1], [2], start=1, end=2)
    rows.write(tmp_path)
    with pytest.raises(ValueError, match="invalid --agent regular expression"):
        _chosen(Built(tmp_path, agent="("), buckets=1)
