"""SamplingClient: logprobs agree with forward, stop sequences, max_tokens, seeds, saved weights."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
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
