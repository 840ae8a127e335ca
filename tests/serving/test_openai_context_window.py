"""The served model's context window on the OpenAI routes: an over-long prompt gets OpenAI's own
``context_length_exceeded`` error (chat, completions, Responses), a ``max_tokens`` above the room the
prompt leaves is clamped to it, ``/v1/models`` reports the context length, and ``--served-name``
takes aliases — against a real ``tinkertrace serve`` (built-in model) with raw httpx and the real
``openai`` SDK, and against the scripted double where exact token counts are needed.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tinkertrace.models.tokenizer import BUILTIN_MODEL, load_tokenizer
from tinkertrace.netutil import free_port, wait_for_port
from tinkertrace.serving.policy import PolicyHolder

CONTEXT = 2048  # the built-in model's max_position_embeddings
LONG = [{"role": "user", "content": "hello " * 2100}]


def _chat_tokens(messages: list[dict[str, Any]]) -> int:
    tokenizer = load_tokenizer(BUILTIN_MODEL)
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return len(tokenizer.encode(text, add_special_tokens=False))


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `tinkertrace serve` with two served names; its base URL (…/v1)."""
    port = free_port()
    engine_dir = tmp_path_factory.mktemp("engine")
    cmd = [sys.executable, "-m", "tinkertrace.cli.main", "serve", "--port", str(port)]
    cmd += ["--engine-dir", str(engine_dir), "--served-name", "tiny", "--served-name", "gpt-5-codex"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_port(port, timeout=90)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_models_list_each_alias_with_the_context_length(serve: str) -> None:
    listed = httpx.get(f"{serve}/models", timeout=30).json()["data"]
    assert [m["id"] for m in listed] == ["tiny", "gpt-5-codex"]
    for model in listed:
        assert model["context_length"] == CONTEXT and model["max_model_len"] == CONTEXT
    one = httpx.get(f"{serve}/models/gpt-5-codex", timeout=30)
    assert one.status_code == 200 and one.json()["id"] == "gpt-5-codex"
    client = openai.OpenAI(base_url=serve, api_key="unused", max_retries=0)
    for name in ("tiny", "gpt-5-codex"):
        reply = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert reply.model == name
    with pytest.raises(openai.NotFoundError, match="`tiny`, `gpt-5-codex`"):
        client.chat.completions.create(model=BUILTIN_MODEL, messages=[{"role": "user", "content": "hi"}])


def test_an_over_long_chat_prompt_gets_openais_context_error(serve: str) -> None:
    n = _chat_tokens(LONG)
    for stream in (False, True):
        answer = httpx.post(
            f"{serve}/chat/completions",
            json={"model": "tiny", "messages": LONG, "max_tokens": 10, "stream": stream},
            timeout=60,
        )
        assert answer.status_code == 400
        assert answer.json() == {
            "error": {
                "message": f"This model's maximum context length is {CONTEXT} tokens. However, your messages "
                f"resulted in {n} tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        }
    client = openai.OpenAI(base_url=serve, api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny", prompt="hello " * 2100, max_tokens=5)
    assert err.value.code == "context_length_exceeded" and err.value.body["param"] == "messages"


def test_an_over_long_responses_input_gets_the_responses_context_error(serve: str) -> None:
    n = _chat_tokens([{"role": "system", "content": "Be brief."}, *LONG])
    answer = httpx.post(
        f"{serve}/responses",
        json={"model": "gpt-5-codex", "instructions": "Be brief.", "input": LONG, "stream": True},
        timeout=60,
    )
    assert answer.status_code == 400
    assert answer.json() == {
        "error": {
            "message": "Your input exceeds the context window of this model. Please adjust your input and "
            f"try again. ({n} input tokens; the context holds {CONTEXT}.)",
            "type": "invalid_request_error",
            "param": "input",
            "code": "context_length_exceeded",
        }
    }


@pytest.fixture
def tight(start_server, scripted, tokenizer, openai_client):
    """(client, sampler, prompt tokens of "hi") with the double's context 4 tokens past that prompt."""
    sampler = scripted(["one two three four five six seven eight nine ten"])
    prompt = _chat_tokens([{"role": "user", "content": "hi"}])
    sampler.context_length = prompt + 4
    return openai_client(start_server(PolicyHolder(sampler, tokenizer, "m"))), sampler, prompt


def test_max_tokens_above_the_room_left_are_clamped_to_it(tight) -> None:
    client, sampler, _ = tight
    hi = [{"role": "user", "content": "hi"}]
    chat = client.chat.completions.create(model="m", messages=hi, max_tokens=1000)
    assert chat.choices[0].finish_reason == "length" and len(chat.choices[0].model_extra["token_ids"]) == 4
    client.chat.completions.create(model="m", messages=hi, max_completion_tokens=1000)
    client.chat.completions.create(model="m", messages=hi)  # the server's default max_tokens too
    resp = client.responses.create(model="m", input=hi, max_output_tokens=1000)
    assert resp.status == "incomplete" and resp.usage.output_tokens == 4
    assert [call[2].max_tokens for call in sampler.calls] == [4, 4, 4, 4]


def test_a_prompt_that_fills_the_context_is_refused_before_sampling(tight) -> None:
    client, sampler, prompt = tight
    sampler.context_length = prompt
    hi = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="m", messages=hi)
    assert err.value.code == "context_length_exceeded"
    assert f"maximum context length is {prompt} tokens. However, your messages resulted in {prompt}" in str(
        err.value
    )
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="m", input=hi)
    assert err.value.code == "context_length_exceeded" and err.value.body["param"] == "input"
    assert sampler.calls == []


def test_the_serve_settings_take_several_served_names(tmp_path: Path) -> None:
    from tinkertrace.serving.settings import ServeSettings

    assert ServeSettings(served_name=["a", "b"]).validate().served_name == ["a", "b"]
    assert ServeSettings().served_name == []
