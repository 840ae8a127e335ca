"""The unchanged ``tinker`` SDK against ``tinkertrace engine``'s API: every call the training loop,
the sampling endpoint and a Tinker user script make, compared with the in-process engine."""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
import torch
from tinker import types

from tinkertrace.engine import ServiceClient as LocalServiceClient
from tinkertrace.engine_server import EngineSettings, create_app
from tinkertrace.engine_server.state import ModelSequencer, ServerState, SessionFinishedError, TrainingModel
from tinkertrace.models.tokenizer import BUILTIN_MODEL
from tinkertrace.netutil import BackgroundServer

from .conftest import KEY, NANO, TEXTS, RunningEngine, datum

LOSSES = {
    "cross_entropy": None,
    "importance_sampling": None,
    "ppo": {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1},
    "cispo": {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1},
    "dro": {"beta": 0.2},
}
ADAM = types.AdamParams(learning_rate=5e-3)


def _steps(
    client: object, loss_fn: str, config: dict | None, steps: int = 2, data: list[types.Datum] | None = None
) -> list[types.ForwardBackwardOutput]:
    """``steps`` fwd/bwd + optim pairs, all submitted before any is awaited, then one forward."""
    data = data or [datum(text, loss_fn, advantage=(-1.0) ** i) for i, text in enumerate(TEXTS)]
    futures = []
    for _ in range(steps):
        futures.append(client.forward_backward(data, loss_fn, config))
        client.optim_step(ADAM)
    futures.append(client.forward(data, loss_fn, config))
    return [f.result() for f in reversed(futures)][::-1]  # retrieved last-first: order is the server's


def test_server_capabilities_health_and_session(engine: RunningEngine, sdk: tinker.ServiceClient) -> None:
    rest = tinker.RestClient(base_url=engine.url, api_key=KEY)
    names = [m.model_name for m in rest.get_server_capabilities().result().supported_models]
    assert {"tinkertrace/tiny-chat", "tinkertrace/tiny-chat:nano", "tinkertrace/tiny-chat:base"} <= set(names)
    assert httpx.get(engine.url + "/api/v1/healthz").json() == {"status": "ok"}  # no key needed
    session_id = sdk.holder.get_session_id()
    beat = httpx.post(
        engine.url + "/api/v1/session_heartbeat", json={"session_id": session_id}, headers={"X-API-Key": KEY}
    )
    assert beat.status_code == 200 and beat.json()["type"] == "session_heartbeat"


@pytest.mark.parametrize("loss_fn", list(LOSSES))
def test_forward_backward_and_optim_step_match_the_in_process_engine(
    engine: RunningEngine, sdk: tinker.ServiceClient, loss_fn: str
) -> None:
    config = LOSSES[loss_fn]
    remote = sdk.create_lora_training_client(NANO, rank=4, seed=7).result()
    local = engine.local.create_lora_training_client(NANO, rank=4, seed=7).result()
    info = remote.get_info()
    assert (info.is_lora, info.lora_rank, info.model_data.model_name) == (True, 4, NANO)
    over_http, in_process = _steps(remote, loss_fn, config), _steps(local, loss_fn, config)
    for got, want in zip(over_http, in_process, strict=True):
        assert got.metrics["loss:sum"] == pytest.approx(want.metrics["loss:sum"], rel=1e-5, abs=1e-6)
        for g, w in zip(got.loss_fn_outputs, want.loss_fn_outputs, strict=True):
            np.testing.assert_allclose(
                g["logprobs"].to_numpy(), w["logprobs"].to_numpy(), rtol=1e-5, atol=1e-6
            )
            np.testing.assert_allclose(
                g["elementwise_loss"].to_numpy(), w["elementwise_loss"].to_numpy(), rtol=1e-5, atol=1e-6
            )
    assert over_http[0].metrics["loss:sum"] != over_http[-1].metrics["loss:sum"]  # the steps did train


def test_state_round_trips_with_and_without_optimizer(
    engine: RunningEngine, sdk: tinker.ServiceClient
) -> None:
    data = [datum(t) for t in TEXTS]
    first = sdk.create_lora_training_client(NANO, rank=4, seed=3).result()
    first.forward_backward(data, "cross_entropy")
    first.optim_step(ADAM).result()
    saved = first.save_state("after-one").result().path
    assert saved == f"tinker://{first.model_id}/weights/after-one"
    first.forward_backward(data, "cross_entropy")
    first.optim_step(ADAM).result()
    uninterrupted = first.forward(data, "cross_entropy").result().metrics["loss:sum"]

    def second_step(client: object) -> float:
        client.forward_backward(data, "cross_entropy")
        client.optim_step(ADAM)
        return client.forward(data, "cross_entropy").result().metrics["loss:sum"]

    resumed = sdk.create_training_client_from_state_with_optimizer(saved).result()
    assert resumed.model_id != first.model_id and resumed.get_info().lora_rank == 4
    assert second_step(resumed) == pytest.approx(uninterrupted, rel=1e-6)  # exact continuation
    fresh_optimizer = sdk.create_training_client_from_state(saved).result()
    assert second_step(fresh_optimizer) != pytest.approx(uninterrupted, rel=1e-6)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # load_state is deprecated in SDK 0.38
        reloaded = sdk.create_lora_training_client(NANO, rank=4, seed=99).result()
        reloaded.load_state_with_optimizer(saved).result()
    assert second_step(reloaded) == pytest.approx(uninterrupted, rel=1e-6)

    rest = tinker.RestClient(base_url=engine.url, api_key=KEY)
    listed = rest.list_checkpoints(first.model_id).result()
    assert [c.tinker_path for c in listed.checkpoints] == [saved]
    assert listed.checkpoints[0].checkpoint_type == "training"
    run = rest.get_training_run(first.model_id).result()
    assert (run.base_model, run.is_lora, run.lora_rank) == (NANO, True, 4)
    assert run.last_checkpoint is not None and run.last_checkpoint.tinker_path == saved
    info = rest.get_weights_info_by_tinker_path(saved).result()
    assert (info.base_model, info.lora_rank, info.train_mlp) == (NANO, 4, True)
    runs = rest.list_training_runs(limit=100).result().training_runs
    assert first.model_id in [r.training_run_id for r in runs]
    admin = tinker.AdminClient(base_url=engine.url, api_key=KEY)
    assert admin.get_billing_usage("2026-01-01T00:00:00Z", "2030-01-01T00:00:00Z").result().data == []
    (storage,) = admin.get_current_checkpoint_storage_usage().result().data
    assert storage.checkpoint_count >= 1 and storage.size_bytes > 0


def test_sampling_clients_sample_and_compute_logprobs(sdk: tinker.ServiceClient) -> None:
    trainer = sdk.create_lora_training_client(NANO, rank=4, seed=1).result()
    tokenizer = trainer.get_tokenizer()  # the SDK's own AutoTokenizer load, from the folder the server names
    ids = tokenizer.encode(TEXTS[0])
    assert ids == datum(TEXTS[0]).model_input.to_ints() + ids[-1:]
    prompt = types.ModelInput.from_ints(ids)
    forward = trainer.forward([datum(TEXTS[0])], "cross_entropy").result().loss_fn_outputs[0]["logprobs"]

    sampler = trainer.save_weights_and_get_sampling_client().result()
    assert sampler.get_base_model() == NANO
    logprobs = sampler.compute_logprobs(prompt).result()
    assert logprobs[0] is None
    np.testing.assert_allclose(logprobs[1:], forward.to_numpy(), atol=1e-4)
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=5)
    response = sampler.sample(prompt, 3, params).result()
    assert len(response.sequences) == 3 and len({s.sequence_id for s in response.sequences}) == 3
    assert all(len(s.tokens) == len(s.logprobs) <= 6 for s in response.sequences)
    assert sampler.sample(prompt, 3, params).result().sequences[0].tokens == response.sequences[0].tokens
    topk = sampler.sample(prompt, 3, params, topk_sample_logprobs=3).result().sequences[0]
    assert topk.tokens == response.sequences[0].tokens and len(topk.topk_logprobs) == len(topk.tokens)
    for token, logprob, top in zip(topk.tokens, topk.logprobs, topk.topk_logprobs, strict=True):
        assert len(top) == 3 and top[0][1] >= top[1][1] >= top[2][1] and top[0][1] >= logprob - 1e-6
        assert token not in dict(top) or dict(top)[token] == pytest.approx(logprob, abs=1e-5)

    path = trainer.save_weights_for_sampler("s0").result().path
    assert path == f"tinker://{trainer.model_id}/sampler_weights/s0"
    from_path = sdk.create_sampling_client(model_path=path).result()
    assert from_path.compute_logprobs(prompt).result()[1:] == pytest.approx(logprobs[1:], abs=1e-5)
    base = sdk.create_sampling_client(base_model=NANO).result()
    assert base.sample(prompt, 1, types.SamplingParams(max_tokens=2)).result().sequences[0].stop_reason in (
        "stop",
        "length",
    )


def test_top_k_and_target_prompt_logprobs_over_http_match_the_in_process_engine(
    engine: RunningEngine, sdk: tinker.ServiceClient
) -> None:
    """What the cookbook's distillation recipes (top-k) and ``decisions`` (sparse targets) ask for."""
    ids = datum(TEXTS[1]).model_input.to_ints()
    targets = np.full((len(ids) - 1, 2), -1, dtype=np.int64)
    targets[:, 0] = ids[1:]
    targets[-1, 1] = 104  # one candidate at the last position, as decisions does
    sparse = types.TensorData.from_torch_sparse(torch.from_numpy(targets), pad_value=-1)
    answers = []
    for client in (
        sdk.create_sampling_client(base_model=NANO).result(),
        engine.local.create_sampling_client(base_model=NANO).result(),
    ):
        answers.append(
            client.sample(
                types.ModelInput.from_ints(ids),
                1,
                types.SamplingParams(max_tokens=1),
                include_prompt_logprobs=True,
                topk_prompt_logprobs=4,
                target_prompt_logprobs=sparse,
            ).result()
        )
    remote, local = answers
    assert remote.topk_prompt_logprobs[0] is None and len(remote.topk_prompt_logprobs[1]) == 4
    np.testing.assert_array_equal(
        remote.topk_prompt_logprobs_np.token_ids, local.topk_prompt_logprobs_np.token_ids
    )
    np.testing.assert_allclose(
        remote.topk_prompt_logprobs_np.logprobs, local.topk_prompt_logprobs_np.logprobs, atol=1e-6
    )
    got, want = remote.target_prompt_logprobs, local.target_prompt_logprobs
    assert got.sparse_crow_indices == sparse.sparse_crow_indices
    np.testing.assert_allclose(got.to_numpy(), want.to_numpy(), atol=1e-6)
    np.testing.assert_allclose(got.to_numpy()[:, 0], remote.prompt_logprobs[1:], atol=1e-6)


def test_calls_of_one_model_run_in_submission_order_across_chunks(
    engine: RunningEngine, sdk: tinker.ServiceClient
) -> None:
    """The SDK sends the chunks of one forward_backward concurrently (the first one last); the server
    must still start them, and the optim_step after them, in seq_id order. Bodies zstd-compressed."""
    client = sdk.create_lora_training_client(NANO, rank=4, seed=5).result()
    reference = engine.local.create_lora_training_client(NANO, rank=4, seed=5).result()
    data = [datum(TEXTS[i % 2]) for i in range(6)]
    holder_config = client.holder._client_config
    previous = holder_config.model_dump()
    object.__setattr__(holder_config, "fwdbwd_max_chunk_len", 2)  # three chunks, sent in parallel
    object.__setattr__(holder_config, "proto_compress_fwdbwd", True)  # zstd bodies, as hosted Tinker asks
    try:
        got = _steps(client, "cross_entropy", None, data=data)
    finally:
        for name in ("fwdbwd_max_chunk_len", "proto_compress_fwdbwd"):
            object.__setattr__(holder_config, name, previous[name])
    want = _steps(reference, "cross_entropy", None, data=data)
    assert [len(r.loss_fn_outputs) for r in got] == [6, 6, 6]
    assert [r.metrics["loss:sum"] for r in got] == pytest.approx(
        [r.metrics["loss:sum"] for r in want], rel=1e-5
    )


def test_custom_losses_run_client_side_through_a_cross_entropy_call(sdk: tinker.ServiceClient) -> None:
    client = sdk.create_lora_training_client(NANO, rank=4, seed=2).result()
    data = [datum(t) for t in TEXTS]

    def weighted_nll(batch: list[types.Datum], logprobs: list) -> tuple:
        pairs = zip(batch, logprobs, strict=True)
        total = sum(-(lp * d.loss_fn_inputs["weights"].to_torch()).sum() for d, lp in pairs)
        return total, {"custom:sum": float(total.detach())}

    custom = client.forward_backward_custom(data, weighted_nll).result()
    builtin = client.forward(data, "cross_entropy").result()
    assert custom.metrics["loss:sum"] == pytest.approx(builtin.metrics["loss:sum"], rel=1e-5)
    assert custom.metrics["custom:sum"] == pytest.approx(custom.metrics["loss:sum"], rel=1e-6)


def test_errors_come_back_in_tinkers_format(engine: RunningEngine, sdk: tinker.ServiceClient) -> None:
    with pytest.raises(tinker.RequestFailedError, match="no-such-model"):
        sdk.create_lora_training_client("/no-such-model", rank=4).result()

    client = sdk.create_lora_training_client(NANO, rank=4, seed=0).result()
    bad = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3]),
        loss_fn_inputs={"target_tokens": [2, 3], "weights": [1.0, 1.0]},
    )
    with pytest.raises(tinker.RequestFailedError, match=r"data\[0\].*shape") as failed:
        client.forward_backward([bad], "cross_entropy").result()
    assert failed.value.category == types.RequestErrorCategory.User
    with pytest.raises(tinker.RequestFailedError, match="unknown loss"):
        client.forward_backward([datum(TEXTS[0])], "no_such_loss").result()
    sparse = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2]),
        loss_fn_inputs={
            "target_tokens": [2, 3],
            "weights": types.TensorData(
                data=[1.0], dtype="float32", shape=[1, 2], sparse_crow_indices=[0, 1], sparse_col_indices=[1]
            ),
        },
    )
    with pytest.raises(tinker.RequestFailedError, match="sparse tensors are not supported"):
        client.forward_backward([sparse], "cross_entropy").result()
    with pytest.raises(tinker.RequestFailedError, match="AdamParams"):
        client.optim_step(types.DimuonParams(learning_rate=0.1)).result()
    assert client.forward_backward([datum(TEXTS[0])], "cross_entropy").result().metrics["loss:sum"] > 0

    with pytest.raises(Exception, match="not found"):
        sdk.create_sampling_client(model_path="tinker://nobody/sampler_weights/none").result()

    unauthorized = httpx.post(engine.url + "/api/v1/create_session", json={}, headers={"X-API-Key": "nope"})
    assert unauthorized.status_code == 401 and "API key" in unauthorized.json()["detail"]
    unknown = httpx.post(
        engine.url + "/api/v1/optim_step",
        json={"model_id": "nobody:train:0", "seq_id": 1, "adam_params": {"learning_rate": 0.1}},
        headers={"X-API-Key": KEY},
    )
    assert unknown.status_code == 404 and "unknown model_id" in unknown.json()["detail"]
    missing = httpx.post(engine.url + "/api/v1/copy_weights", json={}, headers={"X-API-Key": KEY})
    assert missing.status_code == 404 and "not served by tinkertrace engine" in missing.json()["detail"]


def test_closing_a_session_releases_its_models(engine: RunningEngine) -> None:
    service = tinker.ServiceClient(base_url=engine.url, api_key=KEY)
    trainer = service.create_lora_training_client(NANO, rank=4, seed=0).result()
    path = trainer.save_state("kept").result().path
    api = engine.app.app.state.api
    assert trainer.model_id in api.state.models
    service.close("success").result(timeout=30)
    assert trainer.model_id not in api.state.models
    session = trainer.model_id.split(":")[0]
    assert api.state.sessions[session]["finished"]
    beat = httpx.post(
        engine.url + "/api/v1/session_heartbeat", json={"session_id": session}, headers={"X-API-Key": KEY}
    )
    assert beat.status_code == 410
    assert path.endswith("/weights/kept")  # checkpoints outlive the session: another session resumes them
    again = tinker.ServiceClient(base_url=engine.url, api_key=KEY)
    assert again.create_training_client_from_state(path).result().get_info().lora_rank == 4
    again.close("success").result(timeout=30)


def test_results_not_ready_are_polled_again_after_try_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With a 10 ms long-poll, every slower call is first answered ``try_again``; the SDK polls on."""
    caplog.set_level(logging.ERROR, logger="tinkertrace.engine")
    local = LocalServiceClient(tmp_path / "engine", device="cpu", cpu_threads=1)
    app = create_app(local, EngineSettings(retrieve_poll_s=0.01))
    with BackgroundServer(app) as server:
        service = tinker.ServiceClient(base_url=server.url, api_key=KEY)
        client = service.create_lora_training_client(f"{BUILTIN_MODEL}:base", rank=4, seed=0).result()
        data = [datum(TEXTS[i % 2]) for i in range(16)]
        first = client.forward_backward(data, "cross_entropy")
        client.optim_step(ADAM)
        after = client.forward(data, "cross_entropy").result().metrics["loss:sum"]
        assert after < first.result().metrics["loss:sum"]
        service.close("success").result(timeout=30)
    assert app.app.state.api.try_again_answers > 0
    failed = [r.getMessage() for r in caplog.records if r.name.startswith("tinkertrace")]
    assert not failed, f"a route failed (a 500 the SDK retried instead of try_again): {sorted(set(failed))}"


def test_a_session_without_heartbeats_is_released(tmp_path: Path) -> None:
    """A client that stops sending heartbeats (killed) loses its models after the session timeout;
    its checkpoints stay."""
    local = LocalServiceClient(tmp_path / "engine", device="cpu", cpu_threads=1)
    app = create_app(local, EngineSettings(session_timeout_s=4.0))  # the SDK's first heartbeat: after 10 s
    api = app.app.state.api
    with BackgroundServer(app) as server:
        service = tinker.ServiceClient(base_url=server.url, api_key=KEY)
        trainer = service.create_lora_training_client(NANO, rank=4, seed=0).result()
        path = trainer.save_state("before").result().path  # the model was served: save_state needs it
        deadline = time.monotonic() + 30
        while trainer.model_id in api.state.models and time.monotonic() < deadline:
            time.sleep(0.1)
        assert trainer.model_id not in api.state.models
        assert api.state.sessions[trainer.model_id.split(":")[0]]["finished"]
        with contextlib.suppress(Exception):  # stop its heartbeats: the session is already over
            service.close("interrupted").result(timeout=30)
        assert (tmp_path / "engine" / trainer.model_id / "weights" / "before").is_dir() and path


def test_a_model_made_for_a_session_that_finished_meanwhile_is_refused() -> None:
    """A session that expires while its first model is being built (a slow machine) must not end up
    holding a model nobody releases: registering it is refused."""
    state = ServerState()
    session = state.new_session({})
    state.finish_session(session)
    model = TrainingModel(f"{session}:train:0", session, None, ModelSequencer(next_seq_id=1))  # type: ignore[arg-type]
    with pytest.raises(SessionFinishedError, match=f"session {session} has finished"):
        state.add_model(model)
    assert not state.models
