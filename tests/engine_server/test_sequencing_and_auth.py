"""Seq-id ordering of one model's calls, and the API-key rule, without the SDK in the way."""

from __future__ import annotations

from concurrent.futures import Future

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from tinkertrace.engine_server.http import ApiKeyMiddleware
from tinkertrace.engine_server.state import ModelSequencer
from tinkertrace.netutil import BackgroundServer


def _done(value: object) -> Future[object]:
    future: Future[object] = Future()
    future.set_result(value)
    return future


def test_calls_start_in_seq_id_order_whatever_order_they_arrive_in() -> None:
    started: list[int] = []
    sequencer = ModelSequencer(next_seq_id=1)

    def call(seq: int):
        return lambda: (started.append(seq), _done(seq))[1]

    results = {seq: sequencer.submit(seq, call(seq)) for seq in (3, 4, 2)}
    assert started == [] and not any(f.done() for f in results.values())  # seq 1 has not arrived
    results[1] = sequencer.submit(1, call(1))
    assert started == [1, 2, 3, 4]
    assert [results[s].result(timeout=1) for s in (1, 2, 3, 4)] == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="already used"):
        sequencer.submit(2, call(2))


def test_a_call_refused_before_it_runs_fails_only_its_own_future() -> None:
    sequencer = ModelSequencer(next_seq_id=1)

    def refuse() -> Future[object]:
        raise ValueError("unknown loss 'x'")

    failed = sequencer.submit(1, refuse)
    ok = sequencer.submit(2, lambda: _done("fine"))
    with pytest.raises(ValueError, match="unknown loss"):
        failed.result(timeout=1)
    assert ok.result(timeout=1) == "fine"


@pytest.mark.parametrize(
    ("configured", "sent", "status"),
    [
        (None, "tml-anything", 200),
        (None, "sk-other", 401),
        (None, None, 401),
        ("tml-exact", "tml-exact", 200),
        ("tml-exact", "tml-anything", 401),
    ],
)
def test_api_key_rule(configured: str | None, sent: str | None, status: int) -> None:
    inner = Starlette(routes=[Route("/api/v1/{p:path}", lambda r: JSONResponse({"ok": True}))])
    with BackgroundServer(ApiKeyMiddleware(inner, configured)) as server:
        headers = {"X-API-Key": sent} if sent else {}
        assert httpx.get(server.url + "/api/v1/thing", headers=headers).status_code == status
        assert httpx.get(server.url + "/api/v1/healthz").status_code == 200  # the probe needs no key
