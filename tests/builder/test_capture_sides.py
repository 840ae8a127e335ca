"""One call, one triplet: a call recorded by both the client (our SDK) and the sampling endpoint
(``tinkertrace.llm.capture_side = server``, same ``gen_ai.response.id``) builds one triplet, whichever
record arrived first; the token ids are the server's, the rollout and agent scope the client's.
Hand-made rows of both forms, through the real builder on real Parquet."""

from __future__ import annotations

from pathlib import Path

import pytest

from tinkertrace import semconv as sc
from tinkertrace.builder import build_trajectories

from .conftest import SpanRows

SERVER = {sc.LLM_CAPTURE_SIDE: sc.CAPTURE_SERVER}


def _server_span(rows: SpanRows, prompt: list[int], response: list[int], response_id: str, *,
                 rollout_id: str | None, start: float, end: float) -> str:  # fmt: skip
    """The endpoint's record of a call: its own trace, no parent, the exact ids."""
    return rows.span(
        trace="server-" + response_id, name="chat test-model", start=start, end=end, span_type=sc.TYPE_LLM,
        attributes=SERVER, rollout_id=rollout_id, model="test-model", response_id=response_id,
        prompt_token_ids=prompt, response_token_ids=response, response_logprobs=[-0.25] * len(response),
        token_source=sc.SOURCE_SERVER, policy_version=7,
    )  # fmt: skip


@pytest.mark.parametrize("server_first", [True, False])
@pytest.mark.parametrize("server_knows_rollout", [True, False])
@pytest.mark.parametrize("client_has_ids", [True, False])
def test_call_seen_by_client_and_server_is_one_triplet(
    tmp_path: Path, rows: SpanRows, server_first: bool, server_knows_rollout: bool, client_has_ids: bool
) -> None:
    root = rows.rollout("r1", llm_calls=2, rewards=1)
    agent = rows.span(trace="r1", name="invoke_agent solver", start=1, end=90, parent=root,
                      span_type=sc.TYPE_AGENT, rollout_id="r1", agent_name="solver")  # fmt: skip
    client_ids = ([1, 2], [3]) if client_has_ids else ([], [])
    server = lambda: _server_span(  # noqa: E731 - written before or after the client's rows
        rows, [1, 2], [3, 4], "resp-a", rollout_id="r1" if server_knows_rollout else None, start=2.5, end=3.5
    )
    if server_first:
        server_id = server()
        rows.write(tmp_path, "server.parquet")
    client = rows.llm("r1", agent, *client_ids, start=2, end=4, response_id="resp-a",
                      token_source=sc.SOURCE_SERVER if client_has_ids else sc.SOURCE_NONE)  # fmt: skip
    rows.llm("r1", agent, [1, 2, 3, 4, 5], [6], start=5, end=6, response_id="resp-b")  # the client only
    rows.reward("r1", agent, 1.0, at=4.5)
    rows.write(tmp_path, "client.parquet")
    if not server_first:
        server_id = server()
        rows.write(tmp_path, "server.parquet")

    result = build_trajectories(tmp_path)
    summary = result.summary
    assert (summary.llm_spans, summary.llm_calls, summary.triplets) == (
        3 if server_knows_rollout else 2,
        2,
        2,
    )
    assert summary.rollouts_seen == 1  # the endpoint's own trace is no rollout of its own
    first, second = result.triplets.to_pylist()
    # the server's exact ids and policy version, the client's span, rollout and agent
    assert (first["prompt_token_ids"], first["response_token_ids"]) == ([1, 2], [3, 4])
    assert first["response_logprobs"] == [-0.25, -0.25] and first["policy_version"] == 7
    assert (first["span_id"], first["rollout_id"], first["agent_name"]) == (client, "r1", "solver")
    assert first["reward"] == 1.0 and server_id != client
    assert (second["response_id"], second["response_token_ids"]) == ("resp-b", [6])


def test_server_record_alone_builds_its_rollouts_call(tmp_path: Path, rows: SpanRows) -> None:
    """A call only the endpoint recorded (the agent runs without our SDK) still builds, in the
    rollout the endpoint was told (its x-tinkertrace-rollout-id header)."""
    rows.rollout("r1", llm_calls=0)
    _server_span(rows, [1, 2], [3], "resp-a", rollout_id="r1", start=2, end=3)
    rows.write(tmp_path)
    (call,) = build_trajectories(tmp_path).triplets.to_pylist()
    assert (call["rollout_id"], call["response_token_ids"], call["policy_version"]) == ("r1", [3], 7)
