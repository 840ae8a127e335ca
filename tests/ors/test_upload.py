"""Rollout upload where it is configured: the agent's spooled transcript sent by the real ``openreward``
SDK's rollout API (in its own venv) to a stand-in for the hosted API on loopback; no key, no upload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tinkertrace.netutil import BackgroundServer
from tinkertrace.ors.upload import spool_rollout, upload_settings, upload_spool

from .conftest import ORS_PYTHON


def test_spooled_rollouts_go_through_the_sdk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    received: list[tuple[str, dict]] = []

    async def rollouts(request: Request) -> JSONResponse:
        received.append((request.headers.get("x-api-key", ""), await request.json()))
        return JSONResponse({})

    app = Starlette(routes=[Route("/v1/rollouts", rollouts, methods=["POST"])])
    monkeypatch.setenv("OPENREWARD_API_KEY", "or-key")
    arguments, note = upload_settings("my-run", tmp_path / "spool")
    assert note is None and arguments == {"upload_run": "my-run", "upload_spool": str(tmp_path / "spool")}
    submit = {"name": "submit", "arguments": '{"answer": "5"}'}
    messages = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": submit}]},
        {"role": "tool", "tool_call_id": "c1", "content": "Correct."},
    ]
    task = {"id": "arithmetic/train-1/r0", "split": "train", "index": 1}
    spool_rollout(
        str(tmp_path / "spool"),
        "my-run",
        "arithmetic",
        task,
        {"messages": messages, "rewards": {2: 1.0}, "finished": True},
    )
    with BackgroundServer(app) as api:
        monkeypatch.setenv("OPENREWARD_API_URL", api.url)
        said = upload_spool(tmp_path / "spool", python=str(ORS_PYTHON))
    assert said == "uploaded 1 rollouts"
    assert {key for key, _ in received} == {"or-key"}
    events = [event for _, body in received for event in body["events"]]
    text = json.dumps(events)
    assert "my-run" in text and "arithmetic/train-1/r0" in text and "What is 2 + 3?" in text
    logged = [e for e in events if "rolloutEventId" in e]
    assert len(logged) == 3 and [e.get("reward") for e in logged] == [None, None, 1.0]
    assert [e.get("isFinished") for e in logged] == [False, False, True]


def test_without_a_key_nothing_is_spooled_and_the_run_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENREWARD_API_KEY", raising=False)
    arguments, note = upload_settings("my-run", tmp_path)
    assert arguments == {} and "OPENREWARD_API_KEY is not: rollouts are not uploaded" in (note or "")
    assert upload_settings(None, tmp_path) == ({}, None)
    assert upload_spool(tmp_path) == "no OpenReward rollouts to upload"
