"""The recording endpoint's edges (issue 37, "What was seen" 2, 3, 4, 6): ids that round-trip or are
refused at the first call, body limits, rewards and ends that mean what the user meant, Anthropic
clients as they are. Real servers on loopback ports (``serve``, and ``proxy`` in front of ``serve``),
the real OpenAI and Anthropic clients, spans read back from Parquet."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import anthropic
import httpx
import openai
import pytest

from tinkertrace import semconv

MODEL = "scripted-model"
HI = [{"role": "user", "content": "hi"}]
BOTH = ["serve", "proxy"]


def _client(url: str, **options: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="k", max_retries=0, **options)


def _error(response: httpx.Response) -> str:
    return str(response.json()["error"]["message"])


@pytest.mark.parametrize("kind", BOTH)
def test_a_non_ascii_id_in_the_url_or_a_header_is_recorded_rewarded_and_finished(
    recording_endpoint: Callable[..., Any], kind: str
) -> None:
    endpoint = recording_endpoint(kind, ["one", "two"])
    url_id, header_id = "résumé-🚀", "日本-ü"
    by_url = _client(f"{endpoint.url}/rollouts/{url_id}/task/tâche/v1")  # the client percent-encodes it
    first = by_url.chat.completions.create(model=MODEL, messages=HI)
    by_header = httpx.post(  # raw UTF-8 bytes in the header, as curl sends them
        f"{endpoint.url}/v1/chat/completions",
        json={"model": MODEL, "messages": HI},
        headers={
            semconv.HEADER_ROLLOUT_ID: header_id.encode(),
            semconv.HEADER_TASK_ID: b"gsm8k/17",  # only a rollout id is a route segment: '/' is fine here
            semconv.HEADER_AGENT_NAME: "señor".encode(),
        },
        timeout=30,
    )
    assert by_header.status_code == 200, by_header.text
    for rid, response_id in ((url_id, first.id), (header_id, by_header.json()["id"])):
        base = f"{endpoint.url}/v1/rollouts/{quote(rid)}"
        reward = httpx.post(f"{base}/reward", json={"value": 1.0, "response_id": response_id}, timeout=10)
        assert reward.status_code == 200, reward.text
        done = httpx.post(f"{base}/finish", json={}, timeout=10)
        assert done.json() == {"rollout_id": rid, "status": "succeeded", "llm_calls": 1, "rewards": 1}
    rows = endpoint.query(
        "SELECT span_type, rollout_id, task_id, agent_name FROM spans ORDER BY rollout_id, span_type"
    )
    assert rows == [
        ("llm", url_id, "tâche", None),
        ("reward", url_id, "tâche", None),
        ("rollout", url_id, "tâche", None),
        ("llm", header_id, "gsm8k/17", "señor"),
        ("reward", header_id, "gsm8k/17", None),
        ("rollout", header_id, "gsm8k/17", None),
    ]


@pytest.mark.parametrize("kind", BOTH)
def test_ids_that_cannot_round_trip_are_a_400_naming_the_rule_at_the_first_call(
    recording_endpoint: Callable[..., Any], kind: str
) -> None:
    endpoint = recording_endpoint(kind)
    body = {"model": MODEL, "messages": HI}
    by_header = {
        b"a/b": "'/'",
        b"": "empty",
        b"x\ty": "control character",  # other control bytes the HTTP server itself refuses (400)
        b"x" * 300: "over the limit of 256",
        b"caf\xe9": "not UTF-8",
    }
    for value, rule in by_header.items():
        answer = httpx.post(
            f"{endpoint.url}/v1/chat/completions",
            json=body,
            headers={semconv.HEADER_ROLLOUT_ID: value},
            timeout=10,
        )
        assert answer.status_code == 400 and rule in _error(answer), (value, answer.text)
    by_url = {"a%2Fb": "'/'", "": "empty", "x%01y": "control character", "caf%E9": "not UTF-8"}
    for segment, rule in by_url.items():
        answer = httpx.post(f"{endpoint.url}/rollouts/{segment}/v1/chat/completions", json=body, timeout=10)
        assert answer.status_code == 400 and rule in _error(answer), (segment, answer.text)
        reward = httpx.post(f"{endpoint.url}/v1/rollouts/{segment}/reward", json={"value": 1}, timeout=10)
        assert reward.status_code == 400 and rule in _error(reward), (segment, reward.text)
    assert (
        endpoint.recorder.stats()["calls_recorded"] == 0 and endpoint.recorder.stats()["open_rollouts"] == 0
    )


@pytest.mark.parametrize("kind", BOTH)
def test_bodies_over_the_limit_are_a_413_before_they_are_read(
    recording_endpoint: Callable[..., Any], kind: str
) -> None:
    from tinkertrace.serving.limits import MIB, RequestLimits

    endpoint = recording_endpoint(kind, limits=RequestLimits(max_bytes=1 * MIB, timeout_s=1.0))
    huge = (
        b'{"model": "scripted-model", "messages": [{"role": "user", "content": "'
        + b"x" * (16 * MIB)
        + b'"}]}'
    )
    started = time.monotonic()
    chat = httpx.post(f"{endpoint.url}/rollouts/r-big/v1/chat/completions", content=huge, timeout=30)
    assert chat.status_code == 413 and "limit of 1 MiB" in _error(chat)
    assert time.monotonic() - started < 10  # refused from its Content-Length, not tokenised (36.7 s before)

    def chunks() -> Any:  # no Content-Length: refused as the bytes pass the limit
        for _ in range(64):
            yield b"y" * (256 * 1024)

    streamed = httpx.post(f"{endpoint.url}/v1/chat/completions", content=chunks(), timeout=30)
    assert streamed.status_code == 413
    reward = httpx.post(f"{endpoint.url}/v1/rollouts/r-big/reward", content=huge, timeout=30)
    assert reward.status_code == 413
    messages = httpx.post(f"{endpoint.url}/v1/messages", content=huge, timeout=30)
    assert messages.status_code == 413
    assert messages.json()["type"] == "error" and messages.json()["error"]["type"] == "request_too_large"
    slow = _slow_body(endpoint.url, seconds=3.0)
    assert slow.startswith("HTTP/1.1 408"), slow
    assert endpoint.recorder.stats()["calls_recorded"] == 0
    health = httpx.get(f"{endpoint.url}/health", timeout=10).json()
    assert health["requests_refused"] == {"413": 4, "408": 1}


def _slow_body(url: str, seconds: float) -> str:
    """POST a 100-byte body one byte every 0.1 s (over ``seconds``); the status line answered."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 100\r\n\r\n"
        )
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                sock.sendall(b" ")
                time.sleep(0.1)
        except OSError:  # the server answered and closed
            pass
        return sock.recv(4096).decode(errors="replace")


@pytest.mark.parametrize("kind", BOTH)
def test_a_failed_call_records_its_error_and_sizes_not_its_body(
    recording_endpoint: Callable[..., Any], kind: str
) -> None:
    endpoint = recording_endpoint(kind)
    prompt = "z" * 300_000
    client = _client(f"{endpoint.url}/rollouts/r-fail/v1")
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": prompt}])
    [(status, messages, request_size, response_size, error)] = endpoint.query(
        "SELECT json_extract(attributes, '$.\"http.response.status_code\"')::INT, "
        f"json_extract_string(attributes, '$.\"{semconv.GENAI_INPUT_MESSAGES}\"'), "
        "json_extract(attributes, '$.\"http.request.body.size\"')::INT, "
        "json_extract(attributes, '$.\"http.response.body.size\"')::INT, status_message "
        "FROM spans WHERE span_type = 'llm'"
    )
    assert status == 404 and messages is None
    assert request_size > len(prompt) and 0 < response_size < 1000
    assert "does not exist" in error


@pytest.mark.parametrize("kind", BOTH)
def test_a_reward_naming_an_answer_this_rollout_did_not_give_is_refused(
    recording_endpoint: Callable[..., Any], kind: str
) -> None:
    endpoint = recording_endpoint(kind, ["first", "second"])
    mine = _client(f"{endpoint.url}/rollouts/r-mine/v1")
    other = _client(f"{endpoint.url}/rollouts/r-other/v1")
    streamed = list(mine.chat.completions.create(model=MODEL, messages=HI, stream=True))
    theirs = other.chat.completions.create(model=MODEL, messages=HI)
    url = f"{endpoint.url}/v1/rollouts/r-mine/reward"
    for wrong in ("chatcmpl-never-served", theirs.id):
        refused = httpx.post(url, json={"value": 1, "response_id": wrong}, timeout=10)
        assert refused.status_code == 404 and wrong in _error(refused), refused.text
    kept = httpx.post(url, json={"value": 1, "response_id": streamed[0].id}, timeout=10)  # a streamed answer
    assert kept.status_code == 200 and kept.json()["rewards"] == 1
    assert endpoint.query("SELECT rollout_id, response_id FROM spans WHERE span_type = 'reward'") == [
        ("r-mine", streamed[0].id)
    ]


@pytest.mark.parametrize("kind", BOTH)
def test_a_call_after_the_finish_is_a_409_unless_a_new_attempt_reopens_the_rollout(
    recording_endpoint: Callable[..., Any], kind: str
) -> None:
    endpoint = recording_endpoint(kind, ["a", "b", "c"])
    client = _client(f"{endpoint.url}/rollouts/r-done/v1")
    client.chat.completions.create(model=MODEL, messages=HI)
    done = httpx.post(f"{endpoint.url}/v1/rollouts/r-done/finish", json={}, timeout=10)
    assert done.json()["llm_calls"] == 1
    with pytest.raises(openai.ConflictError, match=r"already finished.*attempt/1"):
        client.chat.completions.create(model=MODEL, messages=HI)
    again = _client(f"{endpoint.url}/rollouts/r-done/attempt/1/v1")
    again.chat.completions.create(model=MODEL, messages=HI)
    reopened = httpx.post(f"{endpoint.url}/v1/rollouts/r-done/finish", json={"status": "failed"}, timeout=10)
    assert reopened.json() == {
        "rollout_id": "r-done",
        "status": "failed",
        "llm_calls": 1,
        "rewards": 0,
        "recorded_as": "r-done/attempt/1",
    }
    rows = endpoint.query(
        "SELECT rollout_id, task_id, attempt, count(*) FROM spans GROUP BY ALL ORDER BY rollout_id"
    )
    assert rows == [("r-done", "r-done", 0, 2), ("r-done/attempt/1", "r-done", 1, 2)]


@pytest.mark.parametrize("kind", BOTH)
def test_anthropic_clients_as_they_are(recording_endpoint: Callable[..., Any], kind: str) -> None:
    endpoint = recording_endpoint(kind, ["hello"], api_key="sk-right")
    with_x_api_key = anthropic.Anthropic(
        base_url=f"{endpoint.url}/rollouts/r-a", api_key="sk-right", max_retries=0
    )
    message = with_x_api_key.messages.create(model=MODEL, max_tokens=16, messages=HI)  # type: ignore[arg-type]
    assert message.content[0].text == "hello"  # type: ignore[union-attr]
    with_bearer = anthropic.Anthropic(base_url=endpoint.url, auth_token="sk-right", max_retries=0)
    assert with_bearer.messages.create(model=MODEL, max_tokens=16, messages=HI)  # type: ignore[arg-type]
    wrong = anthropic.Anthropic(base_url=endpoint.url, api_key="sk-wrong-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as refused:
        wrong.messages.create(model=MODEL, max_tokens=16, messages=HI)  # type: ignore[arg-type]
    assert refused.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "Incorrect API key provided: sk-*****-key."},
    }
    bad = httpx.post(f"{endpoint.url}/v1/messages", json={"model": MODEL}, headers={"x-api-key": "sk-right"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    assert bad.json()["type"] == "error"
    with pytest.raises(openai.AuthenticationError, match="Incorrect API key provided"):
        _client(endpoint.url + "/v1").chat.completions.create(model=MODEL, messages=HI)
    openai_shape = httpx.post(
        f"{endpoint.url}/v1/chat/completions", json={}, headers={"x-api-key": "sk-right"}
    )
    assert set(openai_shape.json()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("kind", BOTH)
def test_unknown_paths_are_json_naming_the_path_sent(
    recording_endpoint: Callable[..., Any], kind: str
) -> None:
    endpoint = recording_endpoint(kind)
    no_v1 = httpx.post(f"{endpoint.url}/rollouts/x1/chat/completions", json={}, timeout=10)
    assert no_v1.status_code == 404
    assert "POST /rollouts/x1/chat/completions" in _error(no_v1) and "/v1" in _error(no_v1)
    off_v1 = httpx.get(f"{endpoint.url}/nothing-here", timeout=10)
    assert off_v1.status_code == 404 and _error(off_v1) == "Unknown request URL: GET /nothing-here."
