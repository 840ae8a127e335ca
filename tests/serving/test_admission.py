"""Staleness-aware admission: the gate alone (asyncio), and the real endpoint driven by the real
OpenAI client and by a traced agent (the SDK sends its rollout id with every call)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

import tinkertrace
from tinkertrace import semconv
from tinkertrace.online.publish import admin_publisher, demand_stated, holder_publisher
from tinkertrace.sdk.context import current_rollout
from tinkertrace.serving.admission import AdmissionGate, Demand
from tinkertrace.serving.policy import PolicyHolder
from tinkertrace.testing.waiting import wait_until, wait_until_async


def test_gate_admits_up_to_capacity_then_in_arrival_order() -> None:
    async def scenario() -> list[str]:
        gate = AdmissionGate(poll_s=0.005)
        gate.set_demand(Demand(rollouts_per_step=1, max_staleness=1))  # capacity 2
        order: list[str] = []
        assert await gate.admit("a") == 0.0 and await gate.admit("b") == 0.0

        async def later(rid: str) -> None:
            await gate.admit(rid)
            order.append(rid)

        held = [asyncio.create_task(later("c")), asyncio.create_task(later("d"))]
        await wait_until_async(lambda: gate.stats()["waiting"] == 2, what="two waiters")
        assert order == []
        assert await gate.admit("a") == 0.0  # a later call of an admitted rollout never waits
        gate.consume(["a"])
        await wait_until_async(lambda: gate.stats()["waiting"] == 1, what="one waiter admitted")
        assert order == ["c"]  # one place freed: the first in line, not the newest
        gate.consume(["b", "unknown-id"])
        await asyncio.gather(*held)
        stats = gate.stats()
        assert (stats["admitted"], stats["held"], stats["consumed"], stats["open"]) == (4, 2, 2, 2)
        return order

    assert asyncio.run(scenario()) == ["c", "d"]


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"rollouts_per_step": 0, "max_staleness": 1}, "rollouts_per_step"),
        ({"rollouts_per_step": 1, "max_staleness": -1}, "max_staleness"),
        ({"rollouts_per_step": 1, "max_staleness": 0, "group_size": 0}, "group_size"),
        ({"rollouts_per_step": 1, "max_staleness": 0, "lease_s": 0}, "lease_s"),
    ],
)
def test_a_demand_out_of_range_is_refused_naming_what(fields: dict[str, float], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        Demand(**fields)  # type: ignore[arg-type]


def test_a_demand_shrinks_to_what_the_last_steps_train() -> None:
    demand = Demand(rollouts_per_step=32, max_staleness=2, group_size=8, lease_s=20)
    assert demand.for_steps_left(10) == demand
    assert [demand.for_steps_left(n).capacity for n in (3, 2, 1, 0)] == [96, 64, 32, 32]
    assert demand.for_steps_left(1) == Demand(32, 0, 8, 20)  # the rest unchanged


def test_gate_is_open_without_demand_or_rollout_id() -> None:
    async def scenario() -> None:
        gate = AdmissionGate(poll_s=0.005)
        for i in range(50):  # no demand stated: everything passes
            assert await gate.admit(f"r{i}") == 0.0
        gate.set_demand(Demand(rollouts_per_step=1, max_staleness=0))
        assert await gate.admit(None) == 0.0  # a call outside any rollout is not gated
        assert gate.stats()["held"] == 0

    asyncio.run(scenario())


def test_a_held_call_waits_while_the_trainer_renews_and_passes_once_its_demand_lapses() -> None:
    """No fixed wait limit lets a call through to a rollout too old to train: it waits as long as
    the trainer is heard from, and a trainer gone silent releases it after its lease."""
    now = [0.0]

    async def scenario() -> None:
        gate = AdmissionGate(poll_s=0.002, clock=lambda: now[0])
        gate.set_demand(Demand(rollouts_per_step=1, max_staleness=0, lease_s=10))
        await gate.admit("a")
        held = asyncio.create_task(gate.admit("b"))
        await wait_until_async(lambda: gate.stats()["waiting"] == 1, what="b held")
        for _ in range(30):  # 150 s of a slow trainer (a fixed 30 s wait would have let b in), renewing
            now[0] += 5
            gate.set_demand(Demand(rollouts_per_step=1, max_staleness=0, lease_s=10))
            await asyncio.sleep(0.01)
            assert not held.done()
        gate.consume([])  # consuming counts as word from the trainer too
        now[0] += 9
        await asyncio.sleep(0.02)
        assert not held.done() and gate.stats()["enabled"] is True
        now[0] += 2  # silent for longer than the lease: the trainer is gone, the gate opens
        assert await asyncio.wait_for(held, timeout=1) == 161
        stats = gate.stats()
        assert (stats["enabled"], stats["lapsed"], stats["held"], stats["lease_s"]) == (False, 1, 1, 10)
        assert await gate.admit("c") == 0.0  # open until the trainer states a demand again
        gate.set_demand(Demand(rollouts_per_step=1, max_staleness=0, lease_s=10))
        assert gate.stats()["enabled"] is True

    asyncio.run(scenario())


def test_gate_forgets_a_waiter_that_went_away() -> None:
    async def scenario() -> None:
        gate = AdmissionGate(poll_s=0.005)
        gate.set_demand(Demand(rollouts_per_step=1, max_staleness=0))
        await gate.admit("a")
        task = asyncio.create_task(gate.admit("gone"))
        await wait_until_async(lambda: gate.stats()["waiting"] == 1, what="the waiter in line")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.consume(["a"])
        assert await gate.admit("next") == 0.0  # the cancelled one does not block the line
        assert gate.stats()["waiting"] == 0

    asyncio.run(scenario())


def test_a_withdrawn_demand_releases_held_calls_at_once() -> None:
    async def scenario() -> None:
        gate = AdmissionGate(poll_s=0.005)
        gate.set_demand(Demand(rollouts_per_step=1, max_staleness=0))
        await gate.admit("a")
        held = asyncio.create_task(gate.admit("b"))
        await wait_until_async(lambda: gate.stats()["waiting"] == 1, what="b held")
        assert not held.done()
        gate.withdraw()  # the trainer stopped: nobody is held for it any more
        assert await asyncio.wait_for(held, timeout=1) < 1
        assert gate.stats()["enabled"] is False and gate.stats()["lapsed"] == 0

    asyncio.run(scenario())


def test_a_stated_demand_is_renewed_while_training_and_withdrawn_after() -> None:
    """``demand_stated`` keeps the demand alive past its lease (a step may take longer than it), and
    renews the demand as last restated (the last steps' smaller one)."""
    gate = AdmissionGate()
    publisher = holder_publisher(SimpleNamespace(admission=gate))
    demand = Demand(rollouts_per_step=4, max_staleness=1, group_size=2, lease_s=0.3)
    with demand_stated(publisher, demand) as stated:
        time.sleep(1.0)  # more than three leases without a step
        stats = gate.stats()
        assert (stats["enabled"], stats["lapsed"], stats["capacity"], stats["group_size"]) == (True, 0, 8, 2)
        stated.restate(demand.for_steps_left(1))
        assert gate.stats()["capacity"] == 4  # at once
        time.sleep(0.5)
        assert (gate.stats()["capacity"], gate.stats()["lapsed"]) == (4, 0)  # renewed as restated
    assert gate.stats()["enabled"] is False and gate.stats()["lapsed"] == 0


def test_endpoint_holds_a_new_rollout_until_the_trainer_consumes(scripted_server, openai_client) -> None:
    server, _, policy = scripted_server
    policy.admission.set_demand(Demand(rollouts_per_step=1, max_staleness=1))
    client = openai_client(server)

    def call(rid: str) -> float:
        started = time.monotonic()
        client.chat.completions.create(
            model="scripted-model",
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={semconv.HEADER_ROLLOUT_ID: rid},
        )
        return time.monotonic() - started

    call("r1")
    call("r2")
    with ThreadPoolExecutor(1) as pool:
        third = pool.submit(call, "r3")
        wait_until(lambda: policy.admission.stats()["waiting"] == 1, what="r3 held at the gate")
        assert not third.done()  # capacity 2 is taken by r1 and r2
        call("r1")  # r1's next turn passes while r3 waits
        assert not third.done() and policy.admission.stats()["waiting"] == 1
        policy.admission.consume(["r1"])
        third.result(timeout=10)
    health = httpx.get(server.url + "/health").json()["admission"]
    assert health["admitted"] == 3 and health["held"] == 1 and health["open"] == 2


def test_admin_admission_route_feeds_the_gate_and_refuses_bad_bodies(
    tokenizer, scripted, start_server
) -> None:
    policy = PolicyHolder(scripted(["ok"]), tokenizer, "scripted-model")
    server = start_server(policy, admin_token="secret")
    publisher = admin_publisher(server.url, "secret")
    publisher.demand(Demand(rollouts_per_step=8, max_staleness=2, lease_s=45))
    assert (policy.admission.stats()["capacity"], policy.admission.stats()["lease_s"]) == (24, 45)
    auth = {"Authorization": "Bearer secret"}
    demand = {"rollouts_per_step": 1, "max_staleness": 1}
    for bad in (
        {"rollouts_per_step": 0, "max_staleness": 1},
        {"rollouts_per_step": 4},
        {"rollout_ids": "x"},
        {**demand, "lease_s": 0},
        {**demand, "lease_s": "soon"},
    ):
        answer = httpx.post(server.url + "/admin/admission", json=bad, headers=auth)
        assert answer.status_code == 400, bad
        assert answer.json()["error"]["message"]
    assert httpx.post(server.url + "/admin/admission", json={"rollout_ids": []}).status_code == 401
    assert policy.admission.stats()["capacity"] == 24  # refused bodies changed nothing
    assert policy.admission.stats()["lease_s"] == 45
    publisher.withdraw()  # the trainer stopped
    assert policy.admission.stats()["enabled"] is False


def test_traced_agent_sends_its_rollout_id(scripted_server, tmp_path: Path) -> None:
    """Two calls of one rollout pass a gate of capacity 1; the next rollout waits for the trainer."""
    import openai

    server, _, policy = scripted_server
    policy.admission.set_demand(Demand(rollouts_per_step=1, max_staleness=0))
    tinkertrace.init(spans_dir=tmp_path / "spans")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    finished: list[str] = []
    rollout_ids: list[str] = []

    @tinkertrace.traced_rollout
    def agent(task: dict) -> float:
        rollout_ids.append(current_rollout().rollout_id)
        for _ in range(2):
            client.chat.completions.create(
                model="scripted-model", messages=[{"role": "user", "content": "q"}]
            )
        finished.append(task["id"])
        return 1.0

    try:
        agent({"id": "first"})
        assert policy.admission.stats()["open"] == 1
        second = threading.Thread(target=agent, args=({"id": "second"},))
        second.start()
        wait_until(lambda: policy.admission.stats()["waiting"] == 1, what="the second rollout held")
        assert finished == ["first"]
        policy.admission.consume(rollout_ids[:1])  # the trainer consumed the first
        second.join(timeout=10)
        assert finished == ["first", "second"]
    finally:
        tinkertrace.shutdown()


def test_responses_calls_are_admitted_like_chat_calls(scripted_server, openai_client) -> None:
    server, _, policy = scripted_server
    policy.admission.set_demand(Demand(rollouts_per_step=1, max_staleness=0))
    client = openai_client(server)

    def respond(rid: str) -> None:
        client.responses.create(
            model="scripted-model", input="hi", extra_headers={semconv.HEADER_ROLLOUT_ID: rid}
        )

    respond("a")
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(respond, "b")
        wait_until(lambda: policy.admission.stats()["waiting"] == 1, what="b held at the gate")
        assert not held.done()
        policy.admission.consume(["a"])
        held.result(timeout=10)
    assert policy.admission.stats()["held"] == 1
