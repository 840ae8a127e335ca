"""In-flight weight updates: a sequence whose weights change mid-decode records, per token, the policy
version that sampled it, and each token's logprob is the one under those weights, checked against
decoding the same tokens in two pieces by hand (the first piece under the old weights, the second under
the new ones, on the old cache when it is kept, on a recomputed one otherwise)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tinker import types

from tinkertrace.engine import ServiceClient
from tinkertrace.engine.sampling import SamplingClient
from tinkertrace.models.tokenizer import BUILTIN_MODEL
from tinkertrace.testing.inflight import by_hand, pause_after

NANO_MODEL = f"{BUILTIN_MODEL}:nano"

SWITCH_AT = 3  # forward passes under the old weights: the prefill (token 0) and two steps (tokens 1, 2)
PROMPT = "<|im_start|>user\nsay something long<|im_end|>\n<|im_start|>assistant\n"


def train_one_step(trainer: Any, kit: Any) -> None:
    data = [kit.ce_datum(seq) for seq in kit.sequences()]
    trainer.forward_backward(data, "cross_entropy").result()
    trainer.optim_step(types.AdamParams(learning_rate=5e-2)).result()


@pytest.mark.parametrize("recompute", [False, True], ids=["keep-cache", "recompute-cache"])
def test_versions_and_logprobs_per_token_across_an_update(
    service: ServiceClient, kit: Any, recompute: bool
) -> None:
    trainer = service.create_lora_training_client(kit.NANO, rank=8, seed=0).result()
    old_client: SamplingClient = trainer.save_weights_and_get_sampling_client(kind="inflight").result()
    old_model = old_client.model
    prompt = list(old_client.get_tokenizer().encode(PROMPT, add_special_tokens=False))
    reached, go, handle = pause_after(old_model, SWITCH_AT)
    params = types.SamplingParams(max_tokens=12, temperature=1.0, seed=3)
    future = old_client.sample(types.ModelInput.from_ints(prompt), 4, params)
    try:
        assert reached.wait(120), "decoding never reached the switch point"
        train_one_step(trainer, kit)
        if recompute:  # serving's swap: a snapshot of the new weights takes over the running rows
            new_client = trainer.save_weights_and_get_sampling_client().result()
            assert new_client.take_over(old_client, 1, recompute=True)
        else:  # Tinker's inflight save: the shared batcher's weights are updated
            new_client = trainer.save_weights_and_get_sampling_client(kind="inflight").result()
        go.set()
        sequences = future.result(timeout=120).sequences
    finally:
        go.set()
        handle.remove()
    new_model = new_client.model
    assert new_model is not old_model and old_client.decoder is new_client.decoder
    assert old_client.decoder.recomputes == int(recompute)
    spanning = [s for s in sequences if len(s.tokens) > SWITCH_AT]
    assert spanning, "every sequence stopped before the update"
    for seq in sequences:
        n = len(seq.tokens)
        assert list(seq.policy_versions) == [0] * min(n, SWITCH_AT) + [1] * (n - SWITCH_AT)
    for seq in spanning:
        want = by_hand(old_model, new_model, prompt, list(seq.tokens), SWITCH_AT, recompute)
        np.testing.assert_allclose(seq.logprobs, want, atol=2e-4)
        # the weights did change: the old weights alone give other logprobs after the switch
        all_old = by_hand(old_model, old_model, prompt, list(seq.tokens), SWITCH_AT, True)
        assert np.abs(all_old[SWITCH_AT:] - want[SWITCH_AT:]).max() > 1e-2
    # requests started after the update sample on the new weights from their first token
    later = new_client.sample(types.ModelInput.from_ints(prompt), 1, params).result(timeout=120)
    assert set(later.sequences[0].policy_versions) == {1}
    old_client.close()


def test_inflight_save_while_idle_labels_the_next_request(service: ServiceClient, kit: Any) -> None:
    trainer = service.create_lora_training_client(kit.NANO, rank=8, seed=0).result()
    first = trainer.save_weights_and_get_sampling_client(kind="inflight").result()
    train_one_step(trainer, kit)
    second = trainer.save_weights_and_get_sampling_client(kind="inflight").result()
    prompt = types.ModelInput.from_ints(list(first.get_tokenizer().encode(PROMPT, add_special_tokens=False)))
    params = types.SamplingParams(max_tokens=4, temperature=1.0)
    for client in (first, second):  # both sessions sample the latest inflight weights
        assert set(client.sample(prompt, 1, params).result(timeout=120).sequences[0].policy_versions) == {1}
    assert first.model is second.model
    with pytest.raises(ValueError, match="not supported"):
        trainer.save_weights_and_get_sampling_client(kind="frozen")
    first.close()


def test_a_prompt_the_model_cannot_prefill_fails_its_request_not_the_batcher(service: ServiceClient) -> None:
    """A prefill that raises (a token id outside the vocabulary) fails the requests it was admitting;
    before, their futures were never resolved. The batcher goes on serving."""
    client = service.create_sampling_client(base_model=NANO_MODEL).result()
    params = types.SamplingParams(max_tokens=3)
    bad = client.sample(types.ModelInput.from_ints([10**7]), 1, params)
    with pytest.raises(IndexError):
        bad.result(timeout=60)
    good = client.sample(types.ModelInput.from_ints([1, 2, 3]), 1, params).result(timeout=60)
    assert len(good.sequences[0].tokens) >= 1
    client.close()
