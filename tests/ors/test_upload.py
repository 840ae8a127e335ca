"""Rollout upload where it is configured: each transcript the agent spools is sent, while the run goes
on, by the real ``openreward`` SDK's rollout API (in its own venv) to a stand-in for the hosted API on
loopback, once, even across a restart; no key, no upload."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tinkertrace.netutil import BackgroundServer
from tinkertrace.ors.upload import SpoolUploader, spool_rollout, upload_settings

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
    spool = str(tmp_path / "spool")

    def finish(name: str) -> None:
        task = {"id": name, "split": "train", "index": 1}
        spool_rollout(
            spool, "my-run", "arithmetic", task, {"messages": messages, "rewards": {2: 1.0}, "finished": True}
        )

    def logged() -> list[dict]:
        return [e for _, body in received for e in body["events"] if "rolloutEventId" in e]

    with BackgroundServer(app) as api:
        monkeypatch.setenv("OPENREWARD_API_URL", api.url)
        with SpoolUploader(tmp_path / "spool", python=str(ORS_PYTHON)) as uploader:
            finish("arithmetic/train-1/r0")
            deadline = time.monotonic() + 60
            while len(logged()) < 3 and time.monotonic() < deadline:  # sent while the run goes on
                time.sleep(0.2)
            assert len(logged()) == 3 and uploader.said == ""
            finish("arithmetic/train-1/r1")
        assert uploader.said == "uploaded 2 rollouts"  # the second sent when it stopped
        with SpoolUploader(tmp_path / "spool", python=str(ORS_PYTHON)) as again:  # a resumed run
            finish("arithmetic/train-1/r2")
        assert again.said == "uploaded 1 rollouts"
    assert {key for key, _ in received} == {"or-key"}
    events = [event for _, body in received for event in body["events"]]
    text = json.dumps(events)
    assert "my-run" in text and "What is 2 + 3?" in text
    assert [text.count(f"arithmetic/train-1/r{i}") for i in range(3)] == [1, 1, 1]  # each once
    assert len(logged()) == 9 and [e.get("reward") for e in logged()[:3]] == [None, None, 1.0]
    assert [e.get("isFinished") for e in logged()[:3]] == [False, False, True]


def test_without_a_key_nothing_is_spooled_and_the_run_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENREWARD_API_KEY", raising=False)
    arguments, note = upload_settings("my-run", tmp_path)
    assert arguments == {} and "OPENREWARD_API_KEY is not: rollouts are not uploaded" in (note or "")
    assert upload_settings(None, tmp_path) == ({}, None)
    with SpoolUploader(tmp_path, python=str(tmp_path / "no-python")) as uploader:
        pass
    assert uploader.said.startswith("rollouts not uploaded: no Python with the openreward package")
