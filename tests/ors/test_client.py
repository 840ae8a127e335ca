"""The ORS client against a real ``openreward`` Server (the example's environments, in their own venv):
listing, a multi-turn episode with partial rewards, refusals, a raising tool, a killed server, a
session reaped by the server's own reaper."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tinkertrace.ors.agent import chat_tools, load_tasks
from tinkertrace.ors.client import EnvRef, OrsEnvironment, OrsError, resolve

from .conftest import OrsServer, start_ors_server


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_lists_environments_splits_tasks_and_tools(ors_server: OrsServer) -> None:
    async def listing() -> tuple:
        async with OrsEnvironment(ors_server.url + "/whodunit") as env:
            return await env.environments(), await env.splits(), await env.tasks("test"), await env.tools()

    names, splits, tasks, tools = run(listing())
    assert names == ["arithmetic", "whodunit", "faulty"]
    assert splits == ["train", "test"] and len(tasks) == 16 and tasks[0]["id"] == "test-0"
    by_name = {t["function"]["name"]: t for t in chat_tools(tools)}
    assert sorted(by_name) == ["accuse", "alibis", "evidence", "witness"]
    accuse = by_name["accuse"]["function"]
    assert accuse["parameters"]["required"] == ["name"] and "ends the case" in accuse["description"]
    assert by_name["witness"]["function"]["parameters"] == {"type": "object", "properties": {}}
    assert load_tasks("test", openreward=ors_server.url + "/arithmetic")[3] == {
        "id": "test-3",
        "split": "test",
        "index": 3,
    }


def test_whodunit_episode_partial_rewards_then_finished(ors_server: OrsServer) -> None:
    async def episode() -> tuple:
        async with OrsEnvironment(ors_server.url + "/whodunit") as env:
            spec = (await env.tasks("train"))[2]
            async with env.session("train", 2) as session:
                prompt = await session.prompt()
                results = [
                    await session.call("witness", {}),
                    await session.call("witness", {}),
                    await session.call("nonsense", {}),
                    await session.call("accuse", {"who": 1}),
                    await session.call("evidence", {}),
                    await session.call("accuse", {"name": spec["culprit"]}),
                    await session.call("alibis", {}),
                ]
            return spec, prompt, results

    spec, prompt, results = run(episode())
    assert all(name in prompt for name in spec["suspects"])
    first, again, unknown, bad, evidence, accused, after = results
    assert (first.reward, first.finished, first.text) == (0.1, False, spec["witness"])
    assert again.reward == 0.0  # a clue pays once
    assert (unknown.error, bad.error) == ("not_found", "input_validation") and unknown.reward is None
    assert evidence.reward == 0.1 and evidence.text == spec["evidence"]
    assert (accused.reward, accused.finished, accused.text) == (1.0, True, "Correct: case closed.")
    assert after.error == "episode_finished" and after.reward is None  # refused after the end


def test_a_tool_that_raises_fails_with_its_message(ors_server: OrsServer) -> None:
    async def explode() -> None:
        async with OrsEnvironment(ors_server.url + "/faulty") as env, env.session("train", 0) as session:
            assert (await session.call("fine", {})).reward == 0.5
            await session.call("explode", {})

    with pytest.raises(OrsError, match="raised on the server: the tool broke") as failure:
        run(explode())
    assert failure.value.reason == "tool_error"


def test_server_killed_mid_episode(tmp_path: Path) -> None:
    server = start_ors_server(tmp_path / "server.log")

    async def episode() -> None:
        async with OrsEnvironment(server.url + "/arithmetic") as env, env.session("train", 0) as session:
            assert "What is" in await session.prompt()
            server.process.kill()
            server.process.wait()
            await session.call("submit", {"answer": "3"})

    try:
        with pytest.raises(OrsError, match=r"unreachable|call failed") as failure:
            run(episode())
    finally:
        server.stop()
    assert failure.value.reason == "unreachable"


def test_session_reaped_by_the_server(tmp_path: Path) -> None:
    server = start_ors_server(tmp_path / "server.log", "--idle-s", "0")

    async def episode() -> OrsError:
        async with OrsEnvironment(server.url + "/whodunit") as env, env.session("train", 0) as session:
            assert (await session.call("witness", {})).reward == 0.1
            # poll once a second (a ping refreshes the session; the reaper looks every 5 s), 30 s at most
            for _ in range(30):
                await asyncio.sleep(1)
                try:
                    await session.ping()
                except OrsError as exc:
                    assert exc.reason == "session_gone"
                    break
            else:
                raise TimeoutError("the server's reaper did not delete the idle session within 30 s")
            with pytest.raises(OrsError) as failure:
                await session.call("evidence", {})
            return failure.value

    try:
        error = run(episode())
    finally:
        server.stop()
    assert error.reason == "session_gone" and "reaped or deleted" in str(error)


def test_references_resolve_to_server_environment_and_deployment() -> None:
    local = {"OPENREWARD_URL": "http://127.0.0.1:9/"}
    assert resolve("http://h:1/api/whodunit", {}) == EnvRef("http://h:1/api", "whodunit")
    assert resolve("http://h:1", {}) == EnvRef("http://h:1", None)
    assert resolve("whodunit", local) == EnvRef("http://127.0.0.1:9", "whodunit")
    hosted = resolve("GeneralReasoning/WhoDunIt", {"OPENREWARD_API_KEY": "k"})
    assert (hosted.base_url, hosted.name, hosted.path("tools")) == (
        "https://sessions.openreward.ai",
        None,
        "/tools",
    )
    assert hosted.headers() == {"X-Deployment": "GeneralReasoning/WhoDunIt", "X-API-Key": "k"}
    with pytest.raises(OrsError, match="set OPENREWARD_URL"):
        resolve("whodunit", {})
