"""Continuous batching: concurrent sample calls with different prompts share forward passes and give
what each request gives alone (the one-request reference, ``decoding.generate_one``)."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
from tinker import types

from tinkertrace.engine import ServiceClient, continuous
from tinkertrace.engine.decoding import DecodeRequest, generate_one
from tinkertrace.models.tokenizer import BUILTIN_MODEL

SMALL = f"{BUILTIN_MODEL}:small"
PROMPTS = ("<|im_start|>user\nhi<|im_end|>\n", "a longer prompt about the sea and the wind", "x")


def wait_for(condition: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.fixture
def sampler(service: ServiceClient) -> Any:
    client = service.create_sampling_client(base_model=SMALL).result()
    yield client
    client.close()


def ids(sampler: Any, text: str) -> list[int]:
    return list(sampler.get_tokenizer().encode(text, add_special_tokens=False))


def reference(sampler: Any, prompt: list[int], n: int, params: types.SamplingParams, topk: int = 0) -> Any:
    tok = sampler.get_tokenizer()
    return generate_one(sampler.model, tok, DecodeRequest.build(sampler.model, tok, prompt, n, params, topk))


def assert_same(got: Any, want: Any) -> None:
    assert [list(s.tokens) for s in got] == [list(s.tokens) for s in want]
    assert [s.stop_reason for s in got] == [s.stop_reason for s in want]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=2e-4)


def test_concurrent_different_prompts_match_each_alone(sampler: Any) -> None:
    params = types.SamplingParams(max_tokens=12, temperature=0.0)
    prompts = [ids(sampler, p) for p in PROMPTS]
    futures = [
        sampler.sample(types.ModelInput.from_ints(p), n, params)
        for p, n in zip(prompts, (1, 3, 2), strict=True)
    ]
    results = [f.result(timeout=120) for f in futures]
    for prompt, n, result in zip(prompts, (1, 3, 2), results, strict=True):
        assert len(result.sequences) == n
        assert_same(result.sequences, reference(sampler, prompt, n, params))
    # all three were decoded together: far fewer steps than the 3 x 12 of one request at a time
    assert sampler.decoder.steps <= 2 * 12


def test_a_request_arriving_mid_decode_joins_the_running_batch(sampler: Any) -> None:
    params = types.SamplingParams(max_tokens=40, temperature=0.0, stop=[])
    first, second = ids(sampler, PROMPTS[1]), ids(sampler, PROMPTS[0])
    early = sampler.sample(types.ModelInput.from_ints(first), 2, params)
    wait_for(lambda: sampler.decoder.steps >= 5, "the first request to be decoding")
    late_params = types.SamplingParams(max_tokens=20, temperature=0.0, stop=[])
    late = sampler.sample(types.ModelInput.from_ints(second), 1, late_params)
    assert_same(late.result(timeout=120).sequences, reference(sampler, second, 1, late_params))
    assert_same(early.result(timeout=120).sequences, reference(sampler, first, 2, params))
    assert sampler.decoder.prefills == 2  # the late request was prefilled on its own, then stacked
    assert sampler.decoder.steps < 40 + 20  # and its steps were shared with the running batch


def test_seeded_sampling_is_reproducible_and_follows_the_reference(sampler: Any) -> None:
    prompt = ids(sampler, PROMPTS[0])
    params = types.SamplingParams(max_tokens=16, temperature=1.0, seed=7)
    one = sampler.sample(types.ModelInput.from_ints(prompt), 3, params).result(timeout=120)
    two = sampler.sample(types.ModelInput.from_ints(prompt), 3, params).result(timeout=120)
    assert [list(s.tokens) for s in one.sequences] == [list(s.tokens) for s in two.sequences]
    assert_same(one.sequences, reference(sampler, prompt, 3, params))
    other = sampler.sample(
        types.ModelInput.from_ints(prompt), 3, params.model_copy(update={"seed": 8})
    ).result(timeout=120)
    assert [list(s.tokens) for s in other.sequences] != [list(s.tokens) for s in one.sequences]


def test_stop_strings_and_top_k_logprobs_in_a_shared_batch(sampler: Any) -> None:
    tok = sampler.get_tokenizer()
    prompt = ids(sampler, PROMPTS[1])
    greedy = types.SamplingParams(max_tokens=24, temperature=0.0)
    free_text = tok.decode(reference(sampler, prompt, 1, greedy)[0].tokens)
    stop = free_text[6:8]  # a string the greedy continuation is known to contain
    params = greedy.model_copy(update={"stop": [stop]})
    other = sampler.sample(types.ModelInput.from_ints(ids(sampler, PROMPTS[2])), 2, greedy)
    got = sampler.sample(types.ModelInput.from_ints(prompt), 1, params, topk_sample_logprobs=3).result(120)
    other.result(timeout=120)
    (seq,) = got.sequences
    assert seq.stop_reason == "stop" and stop in tok.decode(seq.tokens)
    assert stop not in tok.decode(seq.tokens[:-1])
    assert_same(got.sequences, reference(sampler, prompt, 1, params, topk=3))
    top = seq.topk_logprobs
    assert len(top) == len(seq.tokens) and all(len(row) == 3 for row in top)
    assert [row[0][0] for row in top] == list(seq.tokens)  # greedy: the top token is the one taken


def test_the_decoding_thread_stops_when_idle_and_restarts(
    sampler: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(continuous, "IDLE_EXIT_S", 0.05)

    def decoders() -> int:
        return sum(t.name == "tinkertrace-decoder" and t.is_alive() for t in threading.enumerate())

    params = types.SamplingParams(max_tokens=3, temperature=0.0)
    prompt = types.ModelInput.from_ints(ids(sampler, PROMPTS[2]))
    before = decoders()
    sampler.sample(prompt, 1, params).result(timeout=60)
    wait_for(lambda: decoders() == before, "the idle decoding thread to exit")
    assert len(sampler.sample(prompt, 1, params).result(timeout=60).sequences[0].tokens) == 3
