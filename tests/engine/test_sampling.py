"""SamplingClient: sampled, prompt, top-k and target logprobs agree with forward; stop sequences,
max_tokens, seeds, saved weights."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from tinker import types

from tinkertrace.engine import CheckpointError, SamplingClient, ServiceClient, TrainingClient


def trained(service: ServiceClient, kit: Any, rank: int = 0, steps: int = 3) -> TrainingClient:
    client = service.create_lora_training_client(kit.NANO, rank=rank, seed=0).result()
    data = [kit.ce_datum(s) for s in kit.sequences()]
    for _ in range(steps):
        client.forward_backward(data, "cross_entropy")
        client.optim_step(types.AdamParams(learning_rate=1e-2))
    return client


def prompt(kit: Any) -> list[int]:
    return kit.sequences()[1][:20]


@pytest.mark.parametrize("rank", [0, 4])
def test_sampled_logprobs_equal_forward_logprobs(service: ServiceClient, kit: Any, rank: int) -> None:
    client = trained(service, kit, rank=rank)
    sampler = client.save_weights_and_get_sampling_client().result()
    assert isinstance(sampler, SamplingClient)
    params = types.SamplingParams(max_tokens=24, temperature=1.0, seed=3)
    response = sampler.sample(types.ModelInput.from_ints(prompt(kit)), 3, params).result()
    assert isinstance(response, types.SampleResponse) and len(response.sequences) == 3
    data = []
    for seq in response.sequences:
        assert len(seq.tokens) == len(seq.logprobs) > 0
        full = prompt(kit) + seq.tokens
        data.append(kit.ce_datum(full))
    out = client.forward(data, "cross_entropy").result()
    for seq, output in zip(response.sequences, out.loss_fn_outputs, strict=True):
        forward_lp = output["logprobs"].to_numpy()[len(prompt(kit)) - 1 :]
        np.testing.assert_allclose(seq.logprobs, forward_lp, atol=1e-4)
    # compute_logprobs scores the same tokens the same way
    full = prompt(kit) + response.sequences[0].tokens
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(full)).result()
    assert scored[0] is None and len(scored) == len(full)
    np.testing.assert_allclose(scored[len(prompt(kit)) :], response.sequences[0].logprobs, atol=1e-4)


def _forward_of_targets(client: TrainingClient, tokens: list[int], targets: np.ndarray) -> np.ndarray:
    """``[len(tokens) - 1, K]``: the trainer's forward logprob of ``targets[i, j]`` after ``tokens[:i + 1]``
    (one Datum per column)."""
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={
                "target_tokens": np.maximum(column, 0).astype(np.int64),
                "weights": np.ones(len(column), np.float32),
            },
        )
        for column in targets.T
    ]
    outputs = client.forward(data, "cross_entropy").result().loss_fn_outputs
    return np.stack([out["logprobs"].to_numpy() for out in outputs], axis=1)


def test_top_k_and_target_prompt_logprobs_equal_a_forward_pass(service: ServiceClient, kit: Any) -> None:
    client = trained(service, kit, rank=4)
    sampler = client.save_weights_and_get_sampling_client().result()
    tokens = kit.sequences()[0]
    n, k = len(tokens), 5
    rng = np.random.default_rng(0)
    targets = rng.integers(0, 256, size=(n - 1, 3))
    targets[::4, 1] = -1  # "nothing asked here"
    targets[:, 0] = tokens[1:]  # the prompt's own next tokens
    response = sampler.sample(
        types.ModelInput.from_ints(tokens),
        1,
        types.SamplingParams(max_tokens=1),
        include_prompt_logprobs=True,
        topk_prompt_logprobs=k,
        target_prompt_logprobs=types.TensorData.from_numpy(targets.astype(np.int64)),
    ).result()

    top = response.topk_prompt_logprobs_np
    assert top is not None and top.token_ids.shape == (n, k)
    assert response.topk_prompt_logprobs[0] is None  # nothing before the first token
    forward_top = _forward_of_targets(client, tokens, top.token_ids[1:])
    np.testing.assert_allclose(top.logprobs[1:], forward_top, atol=1e-4)
    assert (np.diff(top.logprobs[1:], axis=1) <= 0).all()  # most likely first
    own = _forward_of_targets(client, tokens, targets[:, :1])[:, 0]
    assert (top.logprobs[1:, 0] >= own - 1e-5).all()  # nothing beats the top-1
    np.testing.assert_allclose(response.prompt_logprobs[1:], own, atol=1e-4)

    got = response.target_prompt_logprobs.to_numpy()
    assert got.shape == targets.shape
    want = np.where(targets >= 0, _forward_of_targets(client, tokens, targets), 0.0)
    np.testing.assert_allclose(got, want, atol=1e-4)

    # sparse request → sparse answer in the same layout; last_n limits the scored positions
    sparse = types.TensorData.from_torch_sparse(torch.from_numpy(targets.astype(np.int64)), pad_value=-1)
    last = sampler.sample(
        types.ModelInput.from_ints(tokens),
        1,
        types.SamplingParams(max_tokens=1),
        include_prompt_logprobs=True,
        topk_prompt_logprobs=2,
        target_prompt_logprobs=sparse,
        prompt_logprobs_last_n=3,
    ).result()
    assert last.target_prompt_logprobs.sparse_col_indices == sparse.sparse_col_indices
    np.testing.assert_allclose(last.target_prompt_logprobs.to_numpy(), want, atol=1e-4)
    assert all(v is None for v in last.prompt_logprobs[:-3]) and None not in last.prompt_logprobs[-3:]
    assert last.topk_prompt_logprobs[: n - 3] == [None] * (n - 3)
    np.testing.assert_allclose(last.topk_prompt_logprobs_np.logprobs[-3:], top.logprobs[-3:, :2], atol=1e-5)


def test_bad_prompt_logprob_requests(service: ServiceClient, kit: Any) -> None:
    sampler = service.create_sampling_client(base_model=kit.NANO).result()
    tokens = prompt(kit)
    model_input, params = types.ModelInput.from_ints(tokens), types.SamplingParams(max_tokens=1)
    wrong_rows = types.TensorData.from_numpy(np.zeros((len(tokens), 2), np.int64))
    with pytest.raises(ValueError, match=rf"shape \[{len(tokens) - 1}, K\]"):
        sampler.sample(model_input, 1, params, target_prompt_logprobs=wrong_rows)
    too_big = types.TensorData.from_numpy(np.full((len(tokens) - 1, 1), 10**6, np.int64))
    with pytest.raises(ValueError, match="ids must be -1"):
        sampler.sample(model_input, 1, params, target_prompt_logprobs=too_big)
    with pytest.raises(ValueError, match="topk_prompt_logprobs"):
        sampler.sample(model_input, 1, params, topk_prompt_logprobs=10**6)
    with pytest.raises(ValueError, match="prompt_alt_tokens_k"):
        sampler.sample(model_input, 1, params, prompt_alt_tokens_k=2)


def test_max_tokens_seed_and_stop_tokens(service: ServiceClient, kit: Any) -> None:
    sampler = service.create_sampling_client(base_model=kit.NANO).result()
    model_input = types.ModelInput.from_ints(prompt(kit))
    eos = sampler.get_tokenizer().eos_token_id
    free = types.SamplingParams(max_tokens=40, seed=11, stop=[])
    first = sampler.sample(model_input, 1, free).result().sequences[0]
    again = sampler.sample(model_input, 1, free).result().sequences[0]
    assert first.tokens == again.tokens  # same seed, same draw
    limit = first.tokens.index(eos) + 1 if eos in first.tokens else 40
    assert len(first.tokens) == limit
    assert first.stop_reason == ("stop" if eos in first.tokens else "length")

    short = sampler.sample(model_input, 2, types.SamplingParams(max_tokens=3, seed=11)).result()
    assert all(len(s.tokens) <= 3 for s in short.sequences)

    stop_id = first.tokens[5]
    stopped = sampler.sample(model_input, 1, types.SamplingParams(max_tokens=40, seed=11, stop=[stop_id]))
    seq = stopped.result().sequences[0]
    assert seq.tokens == first.tokens[: first.tokens.index(stop_id) + 1]
    assert seq.stop_reason == "stop" and seq.tokens[-1] == stop_id


def test_stop_strings(service: ServiceClient, kit: Any) -> None:
    sampler = service.create_sampling_client(base_model=kit.NANO).result()
    tok = sampler.get_tokenizer()
    model_input = types.ModelInput.from_ints(prompt(kit))
    params = types.SamplingParams(max_tokens=60, seed=5, top_k=60)
    first = sampler.sample(model_input, 1, params).result().sequences[0].tokens
    ascii_pairs = [i for i in range(len(first) - 1) if first[i] < 128 and first[i + 1] < 128]
    assert ascii_pairs, "seeded draw should contain two ASCII bytes in a row"
    j = ascii_pairs[0]
    stop = tok.decode(first[j : j + 2])
    expected_len = next(i + 1 for i in range(len(first)) if stop in tok.decode(first[: i + 1]))
    with_stop = types.SamplingParams(max_tokens=60, seed=5, top_k=60, stop=stop)
    seq = sampler.sample(model_input, 1, with_stop).result().sequences[0]
    assert seq.tokens == first[:expected_len]
    assert seq.stop_reason == "stop"
    assert tok.decode(seq.tokens).endswith(stop)


def test_temperature_zero_is_greedy_and_top_k_one_agrees(service: ServiceClient, kit: Any) -> None:
    sampler = service.create_sampling_client(base_model=kit.NANO).result()
    model_input = types.ModelInput.from_ints(prompt(kit))
    greedy = sampler.sample(model_input, 2, types.SamplingParams(max_tokens=8, temperature=0.0)).result()
    top1 = sampler.sample(model_input, 1, types.SamplingParams(max_tokens=8, top_k=1, seed=1)).result()
    assert greedy.sequences[0].tokens == greedy.sequences[1].tokens == top1.sequences[0].tokens


def test_saved_sampler_weights_reload(service: ServiceClient, kit: Any) -> None:
    client = trained(service, kit, rank=4)
    path = client.save_weights_for_sampler("policy-1").result().path
    assert path == f"tinker://{client.model_id}/sampler_weights/policy-1"
    # a LoRA run keeps only its LoRA weights, merged into the base model when loaded
    folder = service.store.base_dir / client.model_id / "sampler_weights" / "policy-1"
    assert sorted(f.name for f in folder.iterdir()) == ["checkpoint.json", "trainable.safetensors"]
    snapshot = client.save_weights_and_get_sampling_client().result()
    loaded = service.create_sampling_client(model_path=path).result()
    assert loaded.get_base_model() == kit.NANO
    params = types.SamplingParams(max_tokens=12, seed=2)
    model_input = types.ModelInput.from_ints(prompt(kit))
    a = snapshot.sample(model_input, 2, params).result()
    b = loaded.sample(model_input, 2, params).result()
    assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
    with pytest.raises(CheckpointError, match="needs weights"):
        service.create_training_client_from_state(path)


def test_bad_sampling_requests(service: ServiceClient, kit: Any) -> None:
    sampler = service.create_sampling_client(base_model=kit.NANO).result()
    model_input = types.ModelInput.from_ints(prompt(kit))
    with pytest.raises(ValueError, match="num_samples"):
        sampler.sample(model_input, 0, types.SamplingParams(max_tokens=2)).result()
    with pytest.raises(ValueError, match="prompt is empty"):
        sampler.sample(types.ModelInput.empty(), 1, types.SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="top_p"):
        sampler.sample(model_input, 1, types.SamplingParams(max_tokens=2, top_p=0.0)).result()
    with pytest.raises(ValueError, match="model_path or base_model"):
        service.create_sampling_client()
    # still serving after the errors
    assert len(sampler.sample(model_input, 1, types.SamplingParams(max_tokens=2)).result().sequences) == 1


def test_a_local_hugging_face_folder_is_a_base_model(service: ServiceClient, kit: Any) -> None:
    client = trained(service, kit, rank=0, steps=2)
    path = client.save_weights_for_sampler("export").result().path
    folder = service.store.base_dir / client.model_id / "sampler_weights" / "export"
    assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()
    lora = service.create_lora_training_client(str(folder), rank=2, seed=0).result()
    assert lora.get_info().model_data.model_name == str(folder)
    assert lora.get_tokenizer().encode("hi", add_special_tokens=False) == [104, 105]
    data = [kit.ce_datum(s) for s in kit.sequences()]
    # the folder holds the trained weights: same loss as the client that saved them
    expected = client.forward(data, "cross_entropy").result().metrics["loss:sum"]
    got = lora.forward(data, "cross_entropy").result().metrics["loss:sum"]
    assert got == pytest.approx(expected, rel=1e-5)
    assert service.create_sampling_client(base_model=str(folder)).result().get_base_model() == str(folder)
    assert path.endswith("/sampler_weights/export")
