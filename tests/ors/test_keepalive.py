"""An ORS episode whose policy call outlasts the server's session reaping: the agent pings its session
while the policy thinks, so the episode still finishes. The real ORS server reaps sessions idle 2 s
(its reaper looks every 5 s); the policy is a real HTTP endpoint that answers a chat completion
(a structured ``accuse`` call) only after SLOW_S seconds, longer than reaping can take. And a ping
that fails (the session deleted under it) is logged, not raised, and ends the pinging."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import tinkertrace
from tinkertrace.evaluation.rollouts import run_rollouts
from tinkertrace.netutil import BackgroundServer
from tinkertrace.ors import agent
from tinkertrace.ors.agent import run_episode
from tinkertrace.ors.client import OrsEnvironment

from .conftest import OrsServer, start_ors_server

IDLE_S = 2.0  # the server reaps a session idle this long, within 5 s more (its reaper's period)
SLOW_S = 10.0  # each policy answer takes this long: past IDLE_S + 5 s, so an unpinged session is gone


async def slow_chat(request: Request) -> JSONResponse:
    """An OpenAI chat completion, after SLOW_S seconds: a call of ``accuse`` (which ends the case)."""
    body = await request.json()
    await asyncio.sleep(SLOW_S)
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "accuse", "arguments": json.dumps({"name": "Nobody"})},
    }
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    return JSONResponse(
        {
            "id": "chatcmpl-slow",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        }
    )


@pytest.fixture
def ors_reaping(tmp_path: Path) -> Iterator[OrsServer]:
    server = start_ors_server(tmp_path / "server.log", "--idle-s", str(IDLE_S))
    yield server
    server.stop()


@pytest.fixture
def slow_policy() -> Iterator[str]:
    app = Starlette(routes=[Route("/v1/chat/completions", slow_chat, methods=["POST"])])
    with BackgroundServer(app) as bg:
        yield bg.url + "/v1"


def test_session_pinged_while_the_policy_thinks(
    ors_reaping: OrsServer, slow_policy: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent, "PING_INTERVAL_S", 0.25)
    tinkertrace.init(spans_dir=tmp_path / "spans")
    task = {"id": "whodunit/train-0/r0", "split": "train", "index": 0}
    arguments = {"base_url": slow_policy, "model": "m", "openreward": ors_reaping.url + "/whodunit"}
    [result] = run_rollouts(run_episode, [task], samples_per_task=1, agent_kwargs=arguments, concurrency=1)
    tinkertrace.flush()
    # unpinged, the session is reaped mid-call: "ORS session ... is gone (reaped or deleted)"
    assert result.error is None
    assert result.info == {"finished": True, "turns": 1, "rewards": [0.0]}  # a wrong accusation
    assert result.elapsed_s >= SLOW_S


def test_a_failed_ping_is_logged_not_raised(ors_server: OrsServer, caplog: pytest.LogCaptureFixture) -> None:
    async def episode() -> None:
        async with (
            OrsEnvironment(ors_server.url + "/whodunit") as env,
            env.session("train", 0) as opened,
            opened.kept_alive(0.1) as session,
        ):
            await asyncio.sleep(0.3)  # pinged: still there
            assert (await session.call("witness", {})).reward == 0.1
            await session.delete()  # gone under the pinger: its next ping fails, and it stops
            await asyncio.sleep(0.5)

    with caplog.at_level(logging.WARNING, logger="tinkertrace.ors.client"):
        asyncio.run(episode())
    failures = [r.getMessage() for r in caplog.records if "ping failed" in r.getMessage()]
    assert len(failures) == 1 and "reaped or deleted" in failures[0]
