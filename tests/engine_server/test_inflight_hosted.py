"""In-flight weight updates on the hosted path: the follow trainer's publication (``publish_version``)
through the unchanged ``tinker`` SDK against ``tinkertrace engine`` on a loopback socket, into an
endpoint that samples through the SDK too — in this process (``HolderPublisher``) and through the
admin API (``AdminPublisher``, the inflight client travelling as a Tinker sampler handle).

A request being decoded when a version is published continues on the new weights (Tinker's
``kind="inflight"`` client: the service moves it) — its tokens' logprobs are the old weights' up to
the switch and the new weights' after it, checked against decoding it in two pieces by hand — and
with ``inflight="off"`` it finishes on the weights it started on (a snapshot loaded by path)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import openai
import pytest
import tinker
from tinker import types

from tinkertrace import semconv
from tinkertrace.netutil import BackgroundServer
from tinkertrace.online.publish import Publisher, admin_publisher, holder_publisher, publish_version
from tinkertrace.serving.app import create_app
from tinkertrace.serving.policy import PolicyHolder, policy_from_service
from tinkertrace.testing.inflight import by_hand, pause_after

from .conftest import KEY, NANO, TEXTS, RunningEngine, datum

pytestmark = pytest.mark.slow  # four cases, about 10 s with the engine's start

SWITCH_AT = 3  # forward passes under the old weights: the prefill (token 0) and two steps (tokens 1, 2)
ADMIN = "adm-inflight"


@pytest.fixture
def endpoint_service(
    engine: RunningEngine, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tinker.ServiceClient]:
    """The endpoint's own SDK session, as `tinkertrace serve --backend tinker` has in its process (its
    key also opens the sampler handles the trainer publishes)."""
    monkeypatch.setenv("TINKER_API_KEY", KEY)
    service = tinker.ServiceClient(base_url=engine.url, api_key=KEY)
    yield service
    service.close("success").result(timeout=30)


def engine_client(engine: RunningEngine, client: Any) -> Any:
    """The engine's own SamplingClient behind an SDK sampling client (its model decodes the request)."""
    return engine.app.app.state.api.state.samplers[client._sampling_session_id].client  # type: ignore[attr-defined]


def trained_and_published(trainer: Any, publish: Publisher, version: int) -> None:
    """One optimizer step through the SDK, checkpointed and published as ``version`` (the follow
    trainer's order: snapshot sampler path in the record, then ``publish_version``)."""
    trainer.forward_backward([datum(text) for text in TEXTS], "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    path = trainer.save_weights_for_sampler(f"step_{version:06d}").result().path
    publish_version(publish, trainer, {"sampler_path": path, "policy_version": version})


@pytest.mark.parametrize("publisher", ["in-process", "admin"])
@pytest.mark.parametrize("inflight", ["keep-cache", "off"])
def test_a_request_being_decoded_continues_on_weights_published_through_the_hosted_path(
    engine: RunningEngine,
    sdk: tinker.ServiceClient,
    endpoint_service: tinker.ServiceClient,
    publisher: str,
    inflight: str,
) -> None:
    holder: PolicyHolder = policy_from_service(endpoint_service, NANO, inflight=inflight)  # type: ignore[arg-type]
    assert holder.sampler_kind == ("snapshot" if inflight == "off" else "inflight")
    assert type(holder.current().sampling_client) is tinker.SamplingClient  # the client, not a future of one
    trainer = sdk.create_lora_training_client(base_model=NANO, rank=4, seed=1).result()
    with BackgroundServer(create_app(holder, admin_token=ADMIN, batch_window_s=0)) as server:
        in_process = publisher == "in-process"
        publish = holder_publisher(holder) if in_process else admin_publisher(server.url, ADMIN)
        trained_and_published(trainer, publish, 1)  # inflight: the endpoint serves the run's inflight client
        first = engine_client(engine, holder.current().sampling_client)
        old_model = first.model
        reached, go, hook = pause_after(old_model, SWITCH_AT)
        chat = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        request = {"role": "user", "content": "say something long"}
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(
                chat.chat.completions.create,
                model=NANO, messages=[request], max_tokens=12, seed=3, logprobs=True,
            )  # fmt: skip
            try:
                assert reached.wait(120), "decoding never reached the switch point"
                trained_and_published(trainer, publish, 2)  # while the request waits between two steps
            finally:
                go.set()
                hook.remove()
            reply = pending.result(timeout=120)
    second = engine_client(engine, holder.current().sampling_client)
    assert holder.version == 2 and holder.current().model_path.endswith("step_000002")  # type: ignore[union-attr]
    assert type(holder.current().sampling_client) is tinker.SamplingClient  # the client, not a future of one
    tokens = reply.choices[0].model_extra["token_ids"]
    assert len(tokens) > SWITCH_AT, "the reply stopped before the update"
    logprobs = [t.logprob for t in reply.choices[0].logprobs.content]  # type: ignore[union-attr]
    prompt = reply.model_extra["prompt_token_ids"]
    new_model = second.model
    moved = by_hand(old_model, new_model, prompt, tokens, SWITCH_AT, recompute=False)
    stayed = by_hand(old_model, old_model, prompt, tokens, SWITCH_AT, recompute=True)
    assert np.abs(moved[SWITCH_AT:] - stayed[SWITCH_AT:]).max() > 1e-2  # the weights did change
    if inflight == "off":  # a snapshot loaded by path: the request finished on the weights it started on
        np.testing.assert_allclose(logprobs, stayed, atol=2e-4)
        assert second.decoder is not first.decoder
    else:  # the service moved it: one shared inflight target, updated (no snapshot client was loaded)
        np.testing.assert_allclose(logprobs, moved, atol=2e-4)
        assert second.decoder is first.decoder and second.model_path is None
    # Tinker's responses name no version per token: every token carries the version the request
    # started on (inflight: a lower bound, its later tokens came from version 2)
    assert reply.model_extra[semconv.RESPONSE_POLICY_VERSION_RUNS] == [1, len(tokens)]
    holder.close()
