"""Streams that outlive the agent's interest: left without closing, kept open past the rollout, or
ending after ``shutdown()``."""

from __future__ import annotations

import json
import logging
import threading

import openai

import tinkertrace
from tinkertrace import semconv

MESSAGES = [{"role": "user", "content": "a question long enough to stream"}]
REPLY = "echo: a question long enough to stream"


def test_stream_left_without_close_ends_with_its_rollout(openai_server, traced) -> None:
    """The agent breaks out of a stream and keeps the object (no close, no garbage collection): the
    call ends with the rollout as closed early, with the ids read so far, at the time of the last
    bytes read, so the reward given after it follows it."""
    openai_server.options.latency_s = 0.2  # 20 ms between chunks: the agent is ahead of the server
    client = openai.OpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0)
    kept = []

    @tinkertrace.traced_rollout
    def agent(task: str) -> float:
        stream = client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
        kept.append(stream)
        text = ""
        for chunk in stream:
            text += chunk.choices[0].delta.content or ""
            if len(text) >= 4:
                break
        tinkertrace.emit_reward(0.5)
        return 1.0

    assert agent("q") == 1.0
    (llm,) = traced.rows("span_type = 'llm'")
    (root,) = traced.rows("span_type = 'rollout'")
    first, final = traced.rows("span_type = 'reward'")
    attrs = json.loads(llm["attributes"])
    assert attrs[semconv.LLM_CLOSED_EARLY] is True
    assert [e["name"] for e in json.loads(llm["events"])] == ["tinkertrace.ended_with_rollout"]
    ids = llm["response_token_ids"]
    assert 4 <= len(ids) < len(REPLY) and ids == list(REPLY.encode())[: len(ids)]
    assert llm["end_time"] <= first["start_time"] <= final["start_time"] <= root["end_time"]
    assert json.loads(root["attributes"])[semconv.ROLLOUT_LLM_CALLS] == 1
    kept[0].close()  # closing it later records nothing more
    assert len(traced.rows("span_type = 'llm'")) == 1


def test_stream_kept_open_past_the_rollout(openai_server, traced) -> None:
    """A stream returned by the rollout and read afterwards: the rollout is complete when it ends
    (its LLM span is written with it), and the agent still reads every chunk."""
    client = openai.OpenAI(base_url=openai_server.base_url, api_key="x", max_retries=0)

    @tinkertrace.traced_rollout
    def agent(task: str) -> openai.Stream:
        return client.chat.completions.create(model="m", messages=MESSAGES, stream=True)

    stream = agent("q")
    (llm,) = traced.rows("span_type = 'llm'")
    assert json.loads(llm["attributes"])[semconv.LLM_CLOSED_EARLY] is True
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == REPLY
    assert len(traced.rows("span_type = 'llm'")) == 1


def test_span_ending_after_shutdown_is_not_called_a_full_queue(traced, caplog) -> None:
    release, entered = threading.Event(), threading.Event()

    @tinkertrace.traced_rollout
    def agent(task: str) -> None:
        entered.set()
        release.wait(10)

    worker = threading.Thread(target=agent, args=("q",))
    worker.start()
    entered.wait(10)
    tinkertrace.shutdown()
    with caplog.at_level(logging.WARNING, logger="tinkertrace"):
        release.set()
        worker.join(10)
    assert "after tinkertrace.shutdown()" in caplog.text
    assert "queue is full" not in caplog.text
