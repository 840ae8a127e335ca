"""The Tinker SDK's session heartbeats against `tinkertrace engine`, as the hosted tests see them
(:mod:`tinkertrace.testing.tinker_heartbeats`): an open ServiceClient's session beats, closing it
stops its own heartbeat, and the shadow holder of a client rebuilt from a sampler handle — the
endpoint's inflight clients of a trainer's session — stops within one heartbeat period of the
session finishing, when the engine answers its next heartbeat 410."""

from __future__ import annotations

import pytest
import tinker

from tinkertrace.testing.tinker_heartbeats import (
    HEARTBEAT_PERIOD_S,
    heartbeating_sessions,
    wait_heartbeats_stopped,
)

from .conftest import KEY, NANO, RunningEngine

pytestmark = pytest.mark.slow  # waits for one heartbeat period (10 s)


def test_a_sampler_handles_heartbeat_stops_within_one_period_of_its_session_finishing(
    engine: RunningEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TINKER_API_KEY", KEY)  # the handle carries no key: this process's opens it
    before = heartbeating_sessions()
    trainer = tinker.ServiceClient(base_url=engine.url, api_key=KEY)
    sampler = trainer.create_sampling_client(base_model=NANO).result()
    (session,) = heartbeating_sessions() - before  # the trainer's session beats while it is open
    served = tinker.SamplingClient.from_sampler_handle(sampler.get_sampler_handle())  # as the endpoint does
    trainer.close("success").result(timeout=30)
    assert engine.app.app.state.api.state.sessions[session]["finished"]  # type: ignore[attr-defined]
    # the trainer's own heartbeat was cancelled; the handle's shadow holder (cached process-wide, no
    # public close) still beats for the finished session until the engine answers it 410
    assert session in heartbeating_sessions()
    took = wait_heartbeats_stopped({session}, timeout=HEARTBEAT_PERIOD_S + 5)  # TimeoutError if not
    assert session not in heartbeating_sessions() and took <= HEARTBEAT_PERIOD_S + 5
    del served  # held until here, as the endpoint holds the client it serves
