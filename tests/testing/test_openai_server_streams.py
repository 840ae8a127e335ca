"""The test server's streams are its whole answers cut into pieces: each piece carries the token ids
and logprobs of its own text, and the pieces add up to the non-streamed answer."""

from __future__ import annotations

import json

import httpx
import pytest

from tinkertrace.testing.openai_server import byte_logprob, render_chat, scripted_responder

REPLY = "héllo wörld"
MESSAGES = [{"role": "user", "content": "hi"}]


def _chunks(response: httpx.Response) -> list[dict]:
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("chunk_chars", [1, 2, 5])
def test_chat_stream_pieces_carry_their_own_ids_and_logprobs(openai_server, chunk_chars: int) -> None:
    openai_server.options.responder = scripted_responder([REPLY])
    openai_server.options.chunk_chars = chunk_chars
    body = {"model": "m", "messages": MESSAGES, "logprobs": True, "return_token_ids": True, "stream": True}
    chunks = _chunks(httpx.post(openai_server.base_url + "/chat/completions", json=body))
    assert chunks[0]["prompt_token_ids"] == list(render_chat(MESSAGES).encode())
    pieces = [c["choices"][0] for c in chunks if c["choices"][0]["delta"].get("content")]
    assert len(pieces) == -(-len(REPLY) // chunk_chars)
    for piece in pieces:
        ids = piece["token_ids"]
        assert ids == list(piece["delta"]["content"].encode())
        assert [lp["logprob"] for lp in piece["logprobs"]["content"]] == [byte_logprob(t) for t in ids]
    assert [t for p in pieces for t in p["token_ids"]] == list(REPLY.encode())
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_completion_stream_adds_up_to_the_whole_answer(openai_server) -> None:
    openai_server.options.responder = scripted_responder([REPLY])
    openai_server.options.chunk_chars = 3
    body = {"model": "m", "prompt": "hi", "logprobs": 2, "return_token_ids": True, "n": 2}
    url = openai_server.base_url + "/completions"
    whole = httpx.post(url, json=body).json()["choices"]
    chunks = _chunks(httpx.post(url, json={**body, "stream": True}))
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert "".join(p["text"] for p in mine) == whole[index]["text"] == REPLY
        assert [t for p in mine for t in p["token_ids"]] == whole[index]["token_ids"]
        streamed_lps = [lp for p in mine for lp in p["logprobs"]["token_logprobs"]]
        assert streamed_lps == whole[index]["logprobs"]["token_logprobs"]
        assert mine[0]["prompt_token_ids"] == list(b"hi") and "prompt_token_ids" not in mine[1]
        assert [p["finish_reason"] for p in mine] == [None] * (len(mine) - 1) + ["stop"]


def test_requests_are_validated_like_the_endpoint(openai_server) -> None:
    """The same parser as ``tinkertrace serve``: OpenAI's error body, naming the parameter."""
    body = {"model": "m", "messages": [{"role": "wizard", "content": "x"}]}
    r = httpx.post(openai_server.base_url + "/chat/completions", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "messages[0].role" and error["code"] == "invalid_value"
    r = httpx.post(openai_server.base_url + "/completions", json={"model": "m", "prompt": [300, 1]})
    assert r.status_code == 400 and "bytes" in r.json()["error"]["message"]
