"""The OpenAI wire format of the endpoint, with the real OpenAI client over a real socket.

The backend here is the hosted-Tinker double (scripted replies), so stop strings, lengths and
logprobs have exact expected values.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from tinkertrace import semconv
from tinkertrace.serving.policy import PolicyHolder

USER = [{"role": "user", "content": "hi"}]


def _chat_prompt(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def test_chat_returns_sampled_ids_logprobs_and_version(scripted_server, tokenizer, openai_client) -> None:
    server, sampler, _ = scripted_server
    raw = openai_client(server).chat.completions.with_raw_response.create(
        model="scripted-model", messages=USER, n=2, logprobs=True, top_logprobs=2
    )
    resp = raw.parse()
    assert raw.headers[semconv.HEADER_POLICY_VERSION] == "0"
    body = resp.model_dump()
    assert body[semconv.RESPONSE_POLICY_VERSION] == 0
    assert body[semconv.RESPONSE_PROMPT_TOKEN_IDS] == _chat_prompt(tokenizer, USER)
    assert sampler.calls[0][0] == body[semconv.RESPONSE_PROMPT_TOKEN_IDS]  # the template's ids were sampled
    texts = ["hello world. more text", "second reply"]
    for choice, text in zip(resp.choices, texts, strict=True):
        ids = choice.model_extra[semconv.RESPONSE_CHOICE_TOKEN_IDS]
        assert ids == [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
        assert choice.message.content == text  # the end-of-turn token is not in the text
        assert choice.finish_reason == "stop"
        lps = choice.logprobs.content
        assert [lp.logprob for lp in lps] == [-((t % 16) + 1) / 16 for t in ids]
        assert "".join(lp.token for lp in lps[:-1]) == text
        assert all(len(lp.top_logprobs) == 2 and lp.top_logprobs[0].logprob == lp.logprob for lp in lps)
    assert resp.usage.completion_tokens == sum(
        len(c.model_extra[semconv.RESPONSE_CHOICE_TOKEN_IDS]) for c in resp.choices
    )


def test_stop_string_cuts_text_and_ids_after_the_completing_token(
    scripted_server, tokenizer, openai_client
) -> None:
    server, sampler, _ = scripted_server
    resp = openai_client(server).chat.completions.create(
        model="scripted-model", messages=USER, stop=[". m", "zz"]
    )
    choice = resp.choices[0]
    assert choice.message.content == "hello world"
    assert choice.finish_reason == "stop"
    assert choice.model_extra["token_ids"] == tokenizer.encode("hello world. m", add_special_tokens=False)
    assert sampler.calls[-1][2].stop == [". m", "zz"]  # also sent to the backend


def test_max_tokens_gives_length_finish(scripted_server, openai_client) -> None:
    server, sampler, _ = scripted_server
    resp = openai_client(server).chat.completions.create(model="scripted-model", messages=USER, max_tokens=4)
    assert resp.choices[0].finish_reason == "length"
    assert resp.choices[0].message.content == "hell"
    assert len(resp.choices[0].model_extra["token_ids"]) == 4
    assert sampler.calls[-1][2].max_tokens == 4
    resp = openai_client(server).chat.completions.create(
        model="scripted-model", messages=USER, max_completion_tokens=2
    )
    assert resp.choices[0].model_extra["token_ids"] == [115, 101]  # "se" of the second reply


def test_chat_stream_reassembles_to_the_same_answer(scripted_server, tokenizer, openai_client) -> None:
    server, _, _ = scripted_server
    stream = openai_client(server).chat.completions.create(
        model="scripted-model",
        messages=USER,
        n=2,
        stream=True,
        logprobs=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].model_extra[semconv.RESPONSE_PROMPT_TOKEN_IDS] == _chat_prompt(tokenizer, USER)
    text: dict[int, str] = {0: "", 1: ""}
    ids: dict[int, list[int]] = {0: [], 1: []}
    logprobs: dict[int, list[float]] = {0: [], 1: []}
    finish = {}
    for chunk in chunks:
        assert chunk.model_extra[semconv.RESPONSE_POLICY_VERSION] == 0
        for ch in chunk.choices:
            text[ch.index] += ch.delta.content or ""
            ids[ch.index] += (ch.model_extra or {}).get("token_ids") or []
            if ch.logprobs and ch.logprobs.content:
                logprobs[ch.index] += [lp.logprob for lp in ch.logprobs.content]
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
    assert text == {0: "hello world. more text", 1: "second reply"}
    assert ids[1] == [*tokenizer.encode("second reply", add_special_tokens=False), tokenizer.eos_token_id]
    assert logprobs[1] == [-((t % 16) + 1) / 16 for t in ids[1]]
    assert finish == {0: "stop", 1: "stop"}
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == len(ids[0]) + len(ids[1])


def test_completions_text_ids_and_legacy_logprobs(scripted_server, tokenizer, openai_client) -> None:
    server, sampler, _ = scripted_server
    resp = openai_client(server).completions.create(
        model="scripted-model", prompt="abc", logprobs=3, max_tokens=5
    )
    choice = resp.choices[0]
    assert sampler.calls[-1][0] == tokenizer.encode("abc") and sampler.calls[-1][3] == 3
    assert choice.model_extra["prompt_token_ids"] == tokenizer.encode("abc")
    assert choice.text == "hello" and choice.finish_reason == "length"
    assert choice.logprobs.tokens == list("hello")
    assert choice.logprobs.text_offset == [0, 1, 2, 3, 4]
    assert choice.logprobs.token_logprobs == [-((t % 16) + 1) / 16 for t in b"hello"]
    assert all(len(top) == 3 for top in choice.logprobs.top_logprobs)
    # token-id prompts, batched prompts and streaming
    resp = openai_client(server).completions.create(
        model="scripted-model", prompt=[[97, 98], [99]], n=2, max_tokens=1
    )
    assert [c.model_extra["prompt_token_ids"] for c in resp.choices] == [[97, 98], [97, 98], [99], [99]]
    stream = openai_client(server).completions.create(
        model="scripted-model", prompt="x", stream=True, stream_options={"include_usage": True}, max_tokens=3
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) in {"hel", "sec"}
    assert chunks[-1].usage.prompt_tokens == 1


def test_models_lists_the_served_model(scripted_server, openai_client) -> None:
    server, _, _ = scripted_server
    models = openai_client(server).models.list()
    assert [m.id for m in models.data] == ["scripted-model"]
    assert openai_client(server).models.retrieve("scripted-model").id == "scripted-model"
    with pytest.raises(openai.NotFoundError):
        openai_client(server).models.retrieve("other")


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        ({"model": "scripted-model"}, 400, "messages", "missing_required_parameter"),
        ({"messages": USER}, 400, "model", "missing_required_parameter"),
        ({"model": "scripted-model", "messages": "hi"}, 400, "messages", "invalid_type"),
        ({"model": "scripted-model", "messages": [{"content": "x"}]}, 400, "messages[0].role", None),
        (
            {"model": "scripted-model", "messages": [{"role": "wizard", "content": "x"}]},
            400,
            None,
            "invalid_value",
        ),
        ({"model": "scripted-model", "messages": USER, "max_tokens": "5"}, 400, "max_tokens", "invalid_type"),
        (
            {"model": "scripted-model", "messages": USER, "temperature": 7},
            400,
            "temperature",
            "invalid_value",
        ),
        ({"model": "scripted-model", "messages": USER, "n": 0}, 400, "n", "invalid_value"),
        ({"model": "scripted-model", "messages": USER, "stop": [1]}, 400, "stop", "invalid_type"),
        ({"model": "scripted-model", "messages": USER, "top_logprobs": 2}, 400, "top_logprobs", None),
        ({"model": "nope", "messages": USER}, 404, "model", "model_not_found"),
        ([1, 2], 400, None, None),
    ],
)
def test_bad_chat_requests_get_openai_errors(
    scripted_server, body, status, param, code, openai_client
) -> None:
    server, _, _ = scripted_server
    resp = httpx.post(server.url + "/v1/chat/completions", json=body)
    assert resp.status_code == status
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    # the server keeps serving
    ok = openai_client(server).chat.completions.create(model="scripted-model", messages=USER, max_tokens=1)
    assert ok.choices[0].finish_reason == "length"


def test_malformed_json_unknown_route_and_wrong_method(scripted_server, openai_client) -> None:
    server, _, _ = scripted_server
    resp = httpx.post(
        server.url + "/v1/chat/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert resp.status_code == 400 and "JSON" in resp.json()["error"]["message"]
    resp = httpx.post(server.url + "/v1/completions", json={"model": "scripted-model", "prompt": [["a"]]})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "prompt"
    resp = httpx.post(server.url + "/v1/embeddings", json={})
    assert resp.status_code == 404 and resp.json()["error"]["code"] == "unknown_url"
    resp = httpx.get(server.url + "/v1/chat/completions")
    assert resp.status_code == 405 and "error" in resp.json()


def test_api_key_is_required_when_set(tokenizer, scripted, start_server, openai_client) -> None:
    server = start_server(PolicyHolder(scripted(["ok"]), tokenizer, "m"), api_key="sk-secret-key")

    with pytest.raises(openai.AuthenticationError) as err:
        openai_client(server, api_key="sk-wrong-key-123").chat.completions.create(model="m", messages=USER)
    assert err.value.body["code"] == "invalid_api_key"
    assert "sk-wrong" not in json.dumps(err.value.body)  # the key is not echoed back in full
    resp = httpx.get(server.url + "/v1/models")
    assert resp.status_code == 401
    good = openai_client(server, api_key="sk-secret-key").chat.completions.create(model="m", messages=USER)
    assert good.choices[0].message.content == "ok"
    assert httpx.get(server.url + "/health").json()["status"] == "ok"  # health needs no key


def test_stream_request_errors_before_streaming(scripted_server, openai_client) -> None:
    server, _, _ = scripted_server
    with pytest.raises(openai.BadRequestError):
        openai_client(server).chat.completions.create(
            model="scripted-model", messages=USER, stream=True, top_p=3.0
        )


def test_identical_concurrent_requests_share_one_sample_call(
    tokenizer, scripted, start_server, openai_client
) -> None:
    sampler = scripted([f"reply {i}" for i in range(8)], latency_s=0.05)
    server = start_server(PolicyHolder(sampler, tokenizer, "m"), batch_window_s=0.2)
    client = openai_client(server)

    def ask(seed: int | None) -> list[int]:
        r = client.chat.completions.create(model="m", messages=USER, seed=seed)
        return r.choices[0].model_extra["token_ids"]

    with ThreadPoolExecutor(4) as pool:
        merged = list(pool.map(ask, [None] * 4))
    # the first goes out at once (idle server); the three arriving while it runs share one call
    assert [c[1] for c in sampler.calls] == [1, 3]
    assert len({tuple(ids) for ids in merged}) == 4  # each request got its own sample
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(ask, [1, 2, 3]))
    assert [c[1] for c in sampler.calls[2:]] == [1, 1, 1]  # seeded requests are never merged
