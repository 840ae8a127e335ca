"""Admission by whole groups: a group (the rollouts of one task id) starts on one policy version.

Admitted rollout by rollout, a gate whose room ended mid-group started part of a group on one version
and held the rest until the next: in synchronous mode (staleness 0) the trainer could then train
neither part, and dropped them as stale. The gate alone (asyncio) and the real endpoint (the real
OpenAI client, and a traced agent whose SDK sends the task id)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

import tinkertrace
from tinkertrace import semconv
from tinkertrace.online.publish import admin_publisher
from tinkertrace.sdk.context import current_rollout
from tinkertrace.serving.admission import AdmissionGate, Demand
from tinkertrace.serving.policy import PolicyHolder
from tinkertrace.testing.waiting import wait_until, wait_until_async


def test_gate_admits_a_group_whole_or_holds_it_whole() -> None:
    async def scenario() -> None:
        gate = AdmissionGate(poll_s=0.005)
        gate.set_demand(Demand(rollouts_per_step=4, max_staleness=0, group_size=2))  # two groups of two
        admitted: list[str] = []

        async def start(rid: str) -> None:
            await gate.admit(rid, rid[0])  # task "a", "b" or "c"
            admitted.append(rid)

        # the first rollouts of three groups arrive before their second ones (workers interleave)
        for rid in ("a1", "b1"):
            await start(rid)
        held = [asyncio.create_task(start("c1"))]
        await wait_until_async(lambda: gate.stats()["waiting"] == 1, what="c1 held")
        assert gate.stats()["reserved"] == 2  # a and b each hold a place for their second rollout
        for rid in ("a2", "b2"):  # their places were reserved: they pass at once
            await start(rid)
        held.append(asyncio.create_task(start("c2")))
        await wait_until_async(lambda: gate.stats()["waiting"] == 2, what="c2 held with c1")
        assert admitted == ["a1", "b1", "a2", "b2"]  # rollout by rollout, c1 would have taken a's place
        gate.consume(["a1", "a2"])  # the trainer trained group a: group c starts whole
        await asyncio.gather(*held)
        assert sorted(admitted[4:]) == ["c1", "c2"]
        stats = gate.stats()
        assert (stats["open"], stats["reserved"], stats["waiting"]) == (4, 0, 0)

    asyncio.run(scenario())


def test_a_partly_trained_group_gives_back_its_unfilled_places() -> None:
    async def scenario() -> None:
        gate = AdmissionGate(poll_s=0.005)
        gate.set_demand(Demand(rollouts_per_step=3, max_staleness=0, group_size=3))
        await gate.admit("a1", "a")
        await gate.admit("a2", "a")
        assert gate.stats()["reserved"] == 1
        held = asyncio.create_task(gate.admit("b1", "b"))
        await wait_until_async(lambda: gate.stats()["waiting"] == 1, what="b1 held")
        gate.consume(["a1", "a2"])  # trained without its third: a's reservation lapses
        await asyncio.wait_for(held, timeout=5)
        assert gate.stats()["reserved"] == 2  # b's own
        late = asyncio.create_task(gate.admit("a3", "a"))  # a later rollout of task a: a new group
        await wait_until_async(lambda: gate.stats()["waiting"] == 1, what="a3 held as a new group")
        late.cancel()

    asyncio.run(scenario())


def test_endpoint_starts_each_group_on_one_policy_version(scripted, tokenizer, start_server) -> None:
    """Groups arriving interleaved at a synchronous gate (room for one step of two groups of two):
    each group's rollouts are all sampled by one version, the held group by the next one."""
    policy = PolicyHolder(scripted(["a reply"] * 12), tokenizer, "scripted-model", version=1)
    server = start_server(policy, admin_token="secret")
    admin_publisher(server.url, "secret").demand(Demand(rollouts_per_step=4, max_staleness=0, group_size=2))
    assert policy.admission.stats()["group_size"] == 2

    def call(rid: str) -> int:
        headers = {semconv.HEADER_ROLLOUT_ID: rid, semconv.HEADER_TASK_ID: f"task-{rid[0]}"}
        answer = httpx.post(
            server.url + "/v1/chat/completions",
            json={"model": "scripted-model", "messages": [{"role": "user", "content": "hi"}]},
            headers=headers,
            timeout=30,
        )
        answer.raise_for_status()
        return int(answer.json()["policy_version"])

    versions: dict[str, int] = {}
    with ThreadPoolExecutor(2) as pool:
        versions["a1"], versions["b1"] = call("a1"), call("b1")
        c1 = pool.submit(call, "c1")
        wait_until(lambda: policy.admission.stats()["waiting"] == 1, what="c1 held")
        versions["a2"], versions["b2"] = call("a2"), call("b2")
        c2 = pool.submit(call, "c2")
        wait_until(lambda: policy.admission.stats()["waiting"] == 2, what="c2 held")
        policy.swap(policy.current().sampling_client, 2)  # the trainer's step on groups a and b
        policy.admission.consume(["a1", "a2", "b1", "b2"])
        versions["c1"], versions["c2"] = c1.result(timeout=10), c2.result(timeout=10)
    assert versions == {"a1": 1, "a2": 1, "b1": 1, "b2": 1, "c1": 2, "c2": 2}


def test_traced_agent_sends_its_task_id_and_its_group_passes(scripted_server, tmp_path: Path) -> None:
    """A group of two traced rollouts of one task, run one after the other: the second passes on the
    place its group reserved, a rollout of another task waits for the trainer."""
    import openai

    server, _, policy = scripted_server
    policy.admission.set_demand(Demand(rollouts_per_step=2, max_staleness=0, group_size=2))
    tinkertrace.init(spans_dir=tmp_path / "spans")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    rollout_ids: list[str] = []

    @tinkertrace.traced_rollout
    def agent(task: dict) -> float:
        rollout_ids.append(current_rollout().rollout_id)
        client.chat.completions.create(model="scripted-model", messages=[{"role": "user", "content": "q"}])
        return 1.0

    try:
        agent({"id": "t1"})
        assert policy.admission.stats()["reserved"] == 1
        other = threading.Thread(target=agent, args=({"id": "t2"},))
        other.start()
        wait_until(lambda: policy.admission.stats()["waiting"] == 1, what="task t2 held")
        agent({"id": "t1"})  # the second of t1's group: not held behind t2
        assert policy.admission.stats()["waiting"] == 1 and len(rollout_ids) == 3
        policy.admission.consume(rollout_ids[:1] + rollout_ids[2:])
        other.join(timeout=10)
        assert not other.is_alive()
    finally:
        tinkertrace.shutdown()
