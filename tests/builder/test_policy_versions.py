"""Per-token policy versions: the span's ``tinkertrace.policy.version_runs`` come out of the builder as
``response_policy_versions``, one value per response token, in triplets and merged trajectories; a
call without runs repeats its ``policy_version`` (null when that is null too)."""

from __future__ import annotations

from pathlib import Path

from tinkertrace import semconv as sc
from tinkertrace.builder import build_trajectories

from .conftest import SpanRows


def test_runs_expand_per_token_and_merge_across_turns(tmp_path: Path, rows: SpanRows) -> None:
    root = rows.rollout("r1", llm_calls=3)
    runs = {sc.POLICY_VERSION_RUNS: [4, 2, 5, 3]}  # two tokens by version 4, then three by 5
    rows.llm("r1", root, [1, 2], [3, 4, 5, 6, 7], start=1, end=2, policy_version=4, attributes=runs)
    rows.llm("r1", root, [1, 2, 3, 4, 5, 6, 7, 8], [9, 10], start=3, end=4, policy_version=6)  # no runs
    bad = {sc.POLICY_VERSION_RUNS: [6, 9]}  # counts that do not match the tokens: ignored
    rows.llm("r1", root, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [12], start=5, end=6, policy_version=7,
             attributes=bad)  # fmt: skip
    rows.llm("r2", rows.rollout("r2", llm_calls=1), [1], [2, 3], start=1, end=2, policy_version=None)
    rows.write(tmp_path)
    result = build_trajectories(tmp_path)
    triplets = result.triplets.select(["rollout_id", "turn", "response_policy_versions"]).to_pylist()
    assert [t["response_policy_versions"] for t in triplets] == [
        [4, 4, 5, 5, 5],
        [6, 6],
        [7],
        None,
    ]
    trajectories = {t["rollout_id"]: t for t in result.trajectories.to_pylist()}
    merged = trajectories["r1"]
    assert merged["num_turns"] == 3 and merged["policy_version"] == 4
    assert merged["response_policy_versions"] == [4, 4, 5, 5, 5, 6, 6, 7]
    assert len(merged["response_policy_versions"]) == sum(merged["action_mask"])
    assert trajectories["r2"]["response_policy_versions"] is None
