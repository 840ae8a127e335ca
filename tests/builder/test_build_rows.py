"""Builder semantics on hand-made span rows (``schemas.spans()`` Parquet written directly): the
cases the SDK does not produce on its own — Agent-lightning spans, sibling scoping, nested LLM
spans, prefix breaks at the first token — plus filters, incremental builds and determinism."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tinkertrace import schemas
from tinkertrace import semconv as sc
from tinkertrace.builder import BuildSettings, build_trajectories

from .conftest import T0, SpanRows


def build(folder: Path, **opts: object):
    return build_trajectories(folder, None, BuildSettings(**opts))  # type: ignore[arg-type]


def test_empty_and_missing_folder_give_empty_tables(tmp_path: Path) -> None:
    for folder in (tmp_path, tmp_path / "missing"):
        result = build_trajectories(folder, tmp_path / "out")
        assert result.triplets.schema == schemas.triplets()
        assert result.trajectories.schema == schemas.trajectories()
        assert (result.triplets.num_rows, result.trajectories.num_rows) == (0, 0)
        assert result.summary.rollouts_seen == 0


def test_nested_llm_span_of_the_same_call_is_ignored(tmp_path: Path, rows: SpanRows) -> None:
    root = rows.rollout("r1", llm_calls=2)
    outer = rows.llm("r1", root, [1, 2], [3], start=1, end=5, response_id="x")
    rows.llm("r1", outer, [1, 2], [3], start=2, end=4, response_id=None)  # e.g. the HTTP-level span
    rows.write(tmp_path)
    result = build(tmp_path)
    assert result.triplets.column("span_id").to_pylist() == [outer]
    assert result.summary.llm_duplicates == 1


def test_prefix_break_at_first_token_is_other(tmp_path: Path, rows: SpanRows) -> None:
    root = rows.rollout("r1", llm_calls=3)
    rows.llm("r1", root, [1, 2], [3], start=1, end=2)
    rows.llm("r1", root, [1, 2, 3, 4], [5], start=3, end=4)  # extends
    rows.llm("r1", root, [9, 9], [8], start=5, end=6)  # unrelated context
    rows.write(tmp_path)
    trajs = build(tmp_path).trajectories
    assert trajs.column("split_reason").to_pylist() == [None, "other"]
    assert trajs.column("tokens").to_pylist() == [[1, 2, 3, 4, 5], [9, 9, 8]]
    assert trajs.column("action_mask").to_pylist() == [[0, 0, 1, 0, 1], [0, 0, 1]]


def test_agentlightning_spans_are_read(tmp_path: Path, rows: SpanRows) -> None:
    agl = "agentlightning.reward"
    res = {sc.AGL_ROLLOUT_ID: "ro-1", sc.AGL_ATTEMPT_ID: "2"}
    logprobs = json.dumps([{"token": "a", "bytes": [97], "logprob": -0.25, "top_logprobs": []}] * 2)
    rows.span(trace="t1", name="openai.chat.completion", start=1, end=2, resource=res,
              attributes={"prompt_token_ids": [1, 2], "response_token_ids": [3, 4],
                          sc.AGL_LOGPROBS_CONTENT: logprobs})  # fmt: skip
    rows.span(trace="t1", name=sc.AGL_ANNOTATION_SPAN, start=3, end=3, resource=res,
              attributes={f"{agl}.0.name": "task", f"{agl}.0.value": 0.5,
                          f"{agl}.1.name": "style", f"{agl}.1.value": 0.1})  # fmt: skip
    rows.span(trace="t1", name="litellm_request", start=4, end=5, resource=res,
              attributes={sc.AGL_VLLM_PROMPT_TOKEN_IDS: "[1, 2, 3, 4, 7]",
                          sc.AGL_VLLM_RESPONSE_TOKEN_IDS: "[8]"})  # fmt: skip
    rows.span(trace="t1", name=sc.AGL_REWARD_SPAN, start=6, end=6, resource=res, attributes={"reward": 1.0})
    rows.span(trace="t1", name="tool", start=7, end=7, resource=res,
              attributes={"agentops.task.output": json.dumps({"type": "reward", "value": 2.0})})  # fmt: skip
    rows.write(tmp_path)
    result = build(tmp_path)
    trips = result.triplets.to_pylist()
    assert [(t["rollout_id"], t["attempt"], t["turn"]) for t in trips] == [("ro-1", 2, 0), ("ro-1", 2, 1)]
    assert trips[0]["response_logprobs"] == [-0.25, -0.25]
    assert [t["reward"] for t in trips] == [0.5, 1.0]
    assert result.summary.rewards_unmatched == 1  # the AgentOps reward came after both were rewarded
    (traj,) = result.trajectories.drop(["end_time"]).to_pylist()
    assert traj["tokens"] == [1, 2, 3, 4, 7, 8]
    assert traj["action_mask"] == [0, 0, 1, 1, 0, 1]
    assert traj["group_key"] == "ro-1"  # no task id: each rollout is its own group
    assert build(tmp_path, reward_name="style").triplets.column("reward").to_pylist() == [0.1, None]


def _three_rollouts(rows: SpanRows) -> None:
    for i, (task, split, pv) in enumerate([("a", "train", 1), ("b", "eval", 2), ("a", "train", 3)]):
        rid = f"r{i}"
        root = rows.rollout(rid, start=i * 1000, end=i * 1000 + 10, task=task, split=split, llm_calls=1)
        rows.llm(rid, root, [1], [2], start=i * 1000 + 1, end=i * 1000 + 2, policy_version=pv, task=task)


def test_filters(tmp_path: Path, rows: SpanRows) -> None:
    _three_rollouts(rows)
    rows.write(tmp_path)
    t0 = datetime.fromtimestamp(T0 / 1e9, UTC)

    def ids(**opts: object) -> list[str]:
        return sorted(build(tmp_path, **opts).triplets.column("rollout_id").to_pylist())

    assert ids() == ["r0", "r1", "r2"]
    assert ids(since=t0 + timedelta(seconds=0.5)) == ["r1", "r2"]
    assert ids(until=t0 + timedelta(seconds=1.5)) == ["r0", "r1"]
    assert ids(splits=["eval"]) == ["r1"]
    assert ids(tasks=["a"]) == ["r0", "r2"]
    assert ids(min_policy_version=2) == ["r1", "r2"]
    filtered = build(tmp_path, tasks=["a"]).summary
    assert (filtered.rollouts_built, filtered.rollouts_filtered) == (2, 1)


def test_incremental_exclude_rollouts_and_files(tmp_path: Path, rows: SpanRows) -> None:
    _three_rollouts(rows)
    first = rows.write(tmp_path, "part-0.parquet")
    root = rows.rollout("r9", llm_calls=1)
    rows.llm("r9", root, [4], [5], start=1, end=2)
    second = rows.write(tmp_path, "part-1.parquet")
    done = build(tmp_path, files=[first])
    assert done.summary.rollout_ids == ["r0", "r1", "r2"]
    new = build(tmp_path, exclude_rollouts=set(done.summary.rollout_ids))
    assert new.triplets.column("rollout_id").to_pylist() == ["r9"]
    assert new.summary.rollouts_excluded == 3
    assert build(tmp_path, files=[second]).summary.rollout_ids == ["r9"]


def test_a_build_of_some_files_reads_only_those(tmp_path: Path, rows: SpanRows) -> None:
    """Follow mode builds each poll's new files only: a file elsewhere in the folder is not even bound
    (it was: every poll bound the whole folder, its cost growing with the run, and a file of
    conflicting column types anywhere broke every build)."""
    root = rows.rollout("r9", llm_calls=1)
    rows.llm("r9", root, [4], [5], start=1, end=2)
    mine = rows.write(tmp_path, "part-1.parquet")
    conflicting = pa.table({"trace_id": ["t"], "span_id": ["s"], "start_time": ["yesterday"]})
    pq.write_table(conflicting, tmp_path / "foreign.parquet")
    built = build(tmp_path, files=[mine]).summary
    assert (built.rollout_ids, built.corrupt_files) == (["r9"], [])


def test_rebuild_gives_identical_files(tmp_path: Path, rows: SpanRows) -> None:
    _three_rollouts(rows)
    rows.write(tmp_path / "spans")
    a = build_trajectories(tmp_path / "spans", tmp_path / "a")
    b = build_trajectories(tmp_path / "spans", tmp_path / "b")
    for name in ("triplets.parquet", "trajectories.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert pq.read_table(a.triplets_path).equals(b.triplets)
    assert not list((tmp_path / "a").glob(".*"))  # no temporary files left behind


def _many_rollouts(rows: SpanRows, n: int) -> None:
    """``n`` rollouts over 3 tasks, two agents taking turns (multi-turn, prefix-extending), one
    reward per call; rollout ids are not in task order, so group order differs from rollout order."""
    for i in range(n):
        rid = f"r{(i * 7) % n:02d}"
        root = rows.rollout(rid, start=i * 100, end=i * 100 + 90, task=f"t{i % 3}", llm_calls=4)
        prompt: dict[str, list[int]] = {"a": [i, 1], "b": [i, 2]}
        for turn in range(4):
            who = "ab"[turn % 2]
            response = [100 + turn, i]
            at = i * 100 + 10 * turn
            rows.llm(rid, root, prompt[who], response, start=at + 1, end=at + 2, agent=who, task=f"t{i % 3}")
            rows.reward(rid, root, 0.1 * turn + 0.01 * i, at=at + 3)
            prompt[who] = prompt[who] + response + [7]


def test_buckets_give_the_same_files_as_one_pass(tmp_path: Path, rows: SpanRows) -> None:
    _many_rollouts(rows, 10)
    rows.write(tmp_path / "spans")
    for group_by in ("task", "task+agent"):
        outs = []
        for buckets in (1, 3, 7, 40):
            out = tmp_path / f"{group_by}-{buckets}"
            result = build_trajectories(
                tmp_path / "spans", out, BuildSettings(group_by=group_by, buckets=buckets)
            )
            assert result.summary.buckets == buckets
            assert result.summary.triplets == 40
            outs.append([(out / n).read_bytes() for n in ("triplets.parquet", "trajectories.parquet")])
        assert all(o == outs[0] for o in outs[1:]), group_by
    trajs = pq.read_table(tmp_path / "task-3" / "trajectories.parquet")
    assert trajs.num_rows == 20 and set(trajs.column("num_turns").to_pylist()) == {2}
    keys = list(
        zip(*(trajs.column(c).to_pylist() for c in ("group_key", "rollout_id", "agent_name")), strict=True)
    )
    assert keys == sorted(keys)
    trips = pq.read_table(tmp_path / "task-7" / "triplets.parquet")
    keys = list(zip(*(trips.column(c).to_pylist() for c in ("task_id", "rollout_id", "turn")), strict=True))
    assert keys == sorted(keys)


def test_bucket_count_follows_data_size_and_memory_limit(
    tmp_path: Path, rows: SpanRows, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tinkertrace.builder import stream
    from tinkertrace.builder.stream import BUCKET_SHARE, choose_buckets

    assert choose_buckets(0, 2**30) == 1
    assert choose_buckets(int(2**30 * BUCKET_SHARE) * 5, 2**30) == 5
    assert choose_buckets(2**50, 2**20) == 256
    _many_rollouts(rows, 3)
    rows.write(tmp_path)
    assert build(tmp_path).summary.buckets == 1
    # values in the footers: prompts 3 * (2 + 2 + 5 + 5), responses and logprobs 2 * 12 each,
    # one null value per column on the 15 other spans; 4 bytes each
    files = list(tmp_path.rglob("*.parquet"))
    assert stream.token_bytes(duckdb.connect(), files) == 4 * (42 + 24 + 24 + 45)
    monkeypatch.setattr(stream, "BUCKET_SHARE", 100 / 2**30)  # 100 bytes a bucket at 1GB
    tiny = build(tmp_path, memory_limit="1GB")
    assert tiny.summary.buckets == 6 and tiny.summary.triplets == 12


def test_truncated_from_finish_reasons_and_closed_streams(tmp_path: Path, rows: SpanRows) -> None:
    root = rows.rollout("r1")
    marks = [
        {sc.GENAI_FINISH_REASONS: ["stop"]},
        {sc.GENAI_FINISH_REASONS: ["length"]},
        {sc.LLM_CLOSED_EARLY: True},  # a stream the agent stopped reading: the ids it had
        {},
        {sc.AGL_FINISH_REASON: "length"},  # openllmetry's form (Agent-lightning)
        {sc.GENAI_FINISH_REASONS: ["max_output_tokens"]},  # the Responses API's incomplete reason
        {sc.GENAI_FINISH_REASONS: "tool_calls"},  # a plain string from another producer
    ]
    for i, attrs in enumerate(marks):
        rows.llm("r1", root, [1], [2], start=i, end=i + 0.5, attributes=attrs)
    rows.write(tmp_path)
    truncated = [False, True, True, False, True, True, False]
    assert build(tmp_path).triplets.column("truncated").to_pylist() == truncated
