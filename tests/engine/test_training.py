"""TrainingClient: forward_backward on real Datums, optim_step, checkpoints, futures, LoRA vs full."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import torch
from tinker import types

from tinkertrace.engine import CheckpointError, ModelNotFoundError, ServiceClient, TrainingClient
from tinkertrace.engine.batching import microbatches
from tinkertrace.engine.model import load_base_model
from tinkertrace.models.tokenizer import BUILTIN_MODEL

NANO = f"{BUILTIN_MODEL}:nano"

ADAM = types.AdamParams(learning_rate=1e-2)


def reference_logprobs(tokens: list[int]) -> np.ndarray:
    """Target logprobs of a sequence under the untrained built-in base weights, computed directly."""
    model = load_base_model(NANO, torch.device("cpu"))
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokens[:-1]])).logits[0]
    logp = torch.log_softmax(logits.double(), dim=-1)
    return logp[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])].numpy()


def full_client(service: ServiceClient, rank: int = 0) -> TrainingClient:
    return service.create_lora_training_client(NANO, rank=rank, seed=0).result()


def test_cross_entropy_matches_direct_computation(service: ServiceClient, kit: Any) -> None:
    client = full_client(service)
    seqs = kit.sequences()
    weights = [np.r_[np.zeros(10), np.ones(len(s) - 11)] for s in seqs]
    out = client.forward_backward(
        [kit.ce_datum(s, w) for s, w in zip(seqs, weights, strict=True)], "cross_entropy"
    )
    result = out.result()
    assert isinstance(result, types.ForwardBackwardOutput)
    assert len(result.loss_fn_outputs) == len(seqs)
    expected = 0.0
    for seq, w, output in zip(seqs, weights, result.loss_fn_outputs, strict=True):
        ref = reference_logprobs(seq)
        got = output["logprobs"].to_numpy()
        assert got.shape == (len(seq) - 1,)
        np.testing.assert_allclose(got, ref, atol=1e-4)
        expected += float(-(ref * w).sum())
    assert result.metrics["loss:sum"] == pytest.approx(expected, rel=1e-5)


def test_importance_sampling_and_cispo_dro_values(service: ServiceClient, kit: Any) -> None:
    client = full_client(service)
    seq = kit.sequences()[0]
    ref = reference_logprobs(seq)
    rng = np.random.default_rng(0)
    sampling = ref + rng.normal(0, 0.1, ref.shape)
    adv = rng.normal(0, 1, ref.shape)
    datum = kit.rl_datum(seq, sampling, adv)
    ratio = np.exp(ref - sampling.astype(np.float32))
    is_out = client.forward([datum], "importance_sampling").result()
    assert is_out.metrics["loss:sum"] == pytest.approx(float(-(ratio * adv).sum()), rel=1e-4, abs=1e-4)
    cispo = client.forward([datum], "cispo").result()
    expected_cispo = -(np.clip(ratio, 0.8, 1.2) * ref * adv).sum()
    assert cispo.metrics["loss:sum"] == pytest.approx(float(expected_cispo), rel=1e-4, abs=1e-4)
    dro = client.forward([datum], "dro", {"beta": 0.5}).result()
    expected_dro = -(ref * adv - 0.25 * (ref - sampling.astype(np.float32)) ** 2).sum()
    assert dro.metrics["loss:sum"] == pytest.approx(float(expected_dro), rel=1e-4, abs=1e-4)


def test_ppo_clipping_clips_the_gradient(service: ServiceClient, kit: Any) -> None:
    client = full_client(service)
    seq = kit.sequences()[1]
    ref = reference_logprobs(seq)
    # ratio = e > 1.2 with positive advantages: every token is clipped, so no gradient at all
    datum = kit.rl_datum(seq, ref - 1.0, np.ones_like(ref))
    out = client.forward_backward(
        [datum], "ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    ).result()
    assert out.metrics["loss:sum"] == pytest.approx(-1.2 * len(ref), rel=1e-5)
    grads = [p.grad for p in client._model.parameters() if p.grad is not None]
    assert all(float(g.abs().max()) == 0.0 for g in grads)
    # inside the trust region the same data does move the weights
    inside = kit.rl_datum(seq, ref, np.ones_like(ref))
    client.forward_backward([inside], "ppo").result()
    assert any(float(p.grad.abs().max()) > 0 for p in client._model.parameters() if p.grad is not None)


def test_training_lowers_the_loss_and_changes_weights(service: ServiceClient, kit: Any) -> None:
    client = full_client(service)
    data = [kit.ce_datum(s) for s in kit.sequences()]
    before = {n: p.detach().clone() for n, p in client._model.named_parameters()}
    losses = []
    for _ in range(8):
        fb = client.forward_backward(data, "cross_entropy")
        step = client.optim_step(ADAM)  # submitted before awaiting either
        losses.append(fb.result().metrics["loss:sum"])
        assert step.result().metrics is not None
    after = dict(client._model.named_parameters())
    assert any(not torch.equal(before[n], after[n]) for n in before)
    assert losses[-1] < 0.7 * losses[0]
    assert client.step == 8


def test_lora_trains_adapters_only(service: ServiceClient, kit: Any) -> None:
    lora = full_client(service, rank=4)
    full = full_client(service, rank=0)
    info = lora.get_info()
    assert info.is_lora and info.lora_rank == 4 and info.model_data.model_name == NANO
    assert full.get_info().is_lora is False
    lora_trainable = sum(p.numel() for p in lora._model.parameters() if p.requires_grad)
    full_trainable = sum(p.numel() for p in full._model.parameters() if p.requires_grad)
    assert 0 < lora_trainable < full_trainable / 2
    frozen = {n: p.detach().clone() for n, p in lora._model.named_parameters() if not p.requires_grad}
    data = [kit.ce_datum(s) for s in kit.sequences()]
    losses = []
    for _ in range(6):
        fb = lora.forward_backward(data, "cross_entropy")
        lora.optim_step(types.AdamParams(learning_rate=2e-2))
        losses.append(fb.result().metrics["loss:sum"])
    assert losses[-1] < losses[0]
    assert all(torch.equal(frozen[n], p) for n, p in lora._model.named_parameters() if n in frozen)


def test_resume_with_optimizer_is_identical(service: ServiceClient, kit: Any) -> None:
    data = [kit.ce_datum(s) for s in kit.sequences()]
    params = types.AdamParams(learning_rate=5e-3, weight_decay=0.01, grad_clip_norm=1.0)
    a = service.create_lora_training_client(NANO, rank=4, seed=7).result()
    fresh = a.save_state("step-0").result().path  # before any step: no optimizer state yet
    for _ in range(2):
        a.forward_backward(data, "cross_entropy")
        a.optim_step(params)
    path = a.save_state("step-2").result().path
    assert path == f"tinker://{a.model_id}/weights/step-2"
    a.forward_backward(data, "cross_entropy")
    a.optim_step(params).result()

    b = service.create_training_client_from_state_with_optimizer(path).result()
    assert b.model_id != a.model_id and b.step == 2
    b.forward_backward(data, "cross_entropy")
    b.optim_step(params).result()
    for (name, pa), (_, pb) in zip(a._model.named_parameters(), b._model.named_parameters(), strict=True):
        assert torch.equal(pa, pb), name

    start = service.create_training_client_from_state_with_optimizer(fresh).result()
    assert start.step == 0 and start.optim_step(params).result().metrics["step"] == 1.0

    # without the optimizer state the next step differs (Adam moments restart)
    c = service.create_training_client_from_state(path).result()
    c.forward_backward(data, "cross_entropy")
    c.optim_step(params).result()
    assert any(
        not torch.equal(pa, pc)
        for (_, pa), (_, pc) in zip(a._model.named_parameters(), c._model.named_parameters(), strict=True)
    )


def test_futures_await_and_order(service: ServiceClient, kit: Any) -> None:
    client = full_client(service)
    data = [kit.ce_datum(kit.sequences()[0])]

    async def run() -> tuple[float, float]:
        first = client.forward(data, "cross_entropy")
        client.forward_backward(data, "cross_entropy")
        client.optim_step(types.AdamParams(learning_rate=5e-2))
        second = client.forward(data, "cross_entropy")  # queued after the step
        return (await first).metrics["loss:sum"], (await second).metrics["loss:sum"]

    before, after = asyncio.run(run())
    assert after < before
    assert asyncio.run(_await_client(service)).model_id.startswith("run-")


async def _await_client(service: ServiceClient) -> TrainingClient:
    return await service.create_lora_training_client(NANO, rank=2, seed=1)


def test_bad_input_is_reported(service: ServiceClient, kit: Any) -> None:
    client = full_client(service)
    seq = kit.sequences()[0]
    good = kit.ce_datum(seq)
    with pytest.raises(ValueError, match=r"needs loss_fn_inputs \['advantages', 'logprobs'\]"):
        client.forward_backward([good], "importance_sampling").result()
    mask = types.TensorData(data=[1.0], dtype="float32")
    masked = types.Datum(model_input=good.model_input, loss_fn_inputs={**good.loss_fn_inputs, "mask": mask})
    with pytest.raises(ValueError, match=r"does not take loss_fn_inputs \['mask'\]"):
        client.forward([masked], "cross_entropy").result()
    short = types.Datum(
        model_input=good.model_input, loss_fn_inputs={"target_tokens": [1, 2], "weights": [1.0, 1.0]}
    )
    with pytest.raises(ValueError, match=r"data\[1\].*shape \[2\]"):
        client.forward([good, short], "cross_entropy").result()
    nan = kit.rl_datum(seq, np.full(len(seq) - 1, np.nan), np.ones(len(seq) - 1))
    with pytest.raises(ValueError, match="NaN"):
        client.forward([nan], "importance_sampling").result()
    with pytest.raises(ValueError, match="unknown loss_fn"):
        client.forward([good], "bogus")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="data is empty"):
        client.forward([], "cross_entropy").result()
    # the client still works after the errors
    assert client.forward([good], "cross_entropy").result().metrics["loss:sum"] > 0


def test_bad_models_and_paths_are_reported(service: ServiceClient) -> None:
    with pytest.raises(ModelNotFoundError, match="not found"):
        service.create_lora_training_client("/no/such/model", rank=4)
    with pytest.raises(ModelNotFoundError, match="unknown built-in size"):
        service.create_lora_training_client("tinkertrace/tiny-chat:huge", rank=4)
    with pytest.raises(CheckpointError, match="not found"):
        service.create_training_client_from_state("tinker://run-x/weights/none")
    with pytest.raises(CheckpointError, match="must look like"):
        service.create_training_client_from_state("/tmp/whatever")
    client = full_client(service)
    client.save_state("s").result()
    with pytest.raises(CheckpointError, match="already exists"):
        client.save_state("s").result()
    with pytest.raises(CheckpointError, match="invalid checkpoint name"):
        client.save_state("../escape").result()


def test_microbatches_group_rows_of_similar_length() -> None:
    def passes(lengths: list[int], **limits: int) -> list[list[int]]:
        return [rows.tolist() for rows in microbatches(lengths, **limits)]

    assert passes([5, 5, 5], budget=10) == [[0, 1], [2]]  # the padded-token budget still splits
    assert passes([3, 9, 2], budget=100) == [[2, 0, 1]]  # padding cheaper than another pass: one
    # a long episode among short ones gets its own pass, the short ones share one (ties keep order)
    assert passes([80, 75, 800, 80, 150], pass_tokens=256) == [[1, 0, 3, 4], [2]]
    assert passes([80, 75, 800, 80, 150], pass_tokens=10_000) == [[1, 0, 3, 4, 2]]


def test_microbatches_give_the_same_loss_and_gradients(service: ServiceClient, kit: Any) -> None:
    seqs = kit.sequences()
    seqs = [seqs[0] * 6, *seqs, seqs[1][:12]]  # lengths far apart: passes of their own
    data = [kit.ce_datum(s) for s in seqs]
    whole = full_client(service)
    split = full_client(service)
    split.microbatch_tokens = 60  # forward passes of at most 60 padded tokens
    whole.microbatch_tokens, whole.pass_tokens = 10**6, 10**9  # one pass, padded to the longest
    passes = microbatches([len(d.model_input.to_ints()) for d in data], split.microbatch_tokens)
    assert len(passes) > 2 and sorted(np.concatenate(passes).tolist()) == list(range(len(data)))
    a = whole.forward_backward(data, "cross_entropy").result()
    b = split.forward_backward(data, "cross_entropy").result()
    assert b.metrics["loss:sum"] == pytest.approx(a.metrics["loss:sum"], rel=1e-5)
    for out_a, out_b, datum in zip(a.loss_fn_outputs, b.loss_fn_outputs, data, strict=True):
        assert len(out_b["logprobs"].to_numpy()) == len(datum.model_input.to_ints())  # in the Datums' order
        np.testing.assert_allclose(out_b["logprobs"].to_numpy(), out_a["logprobs"].to_numpy(), atol=1e-5)
    for pa, pb in zip(whole._model.parameters(), split._model.parameters(), strict=True):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=1e-6)
