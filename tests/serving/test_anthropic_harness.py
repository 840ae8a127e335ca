"""The Messages API as Claude Code sends it in its default mode (issue 49): a ``system`` message inside
``messages``, ``thinking``, ``context_management``, ``output_config``, ``cache_control`` on blocks and
tools, ``metadata``, ``max_tokens: 32000``, ``?beta=true`` and ``anthropic-beta`` headers, always
streamed; thinking and tool blocks in the history; the context window (clamped ``max_tokens``,
Anthropic's own "prompt is too long" error); the probes it sends to its base URL. Checked with the real
``anthropic`` client and raw httpx against a real server on a loopback port."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import duckdb
import httpx
import pytest
from anthropic.types import Message

from tinkertrace.netutil import BackgroundServer
from tinkertrace.serving.policy import PolicyHolder
from tinkertrace.serving.recording import CallRecorder
from tinkertrace.spanstore.reader import open_spans

MODEL = "scripted-model"
BETAS = "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27"
HEADERS = {"x-api-key": "k", "anthropic-version": "2023-06-01", "anthropic-beta": BETAS}
CACHE = {"type": "ephemeral"}
SYSTEM_INSIDE = "<system-reminder>Today's date is 2026-12-08.</system-reminder>"
BASH = {
    "name": "Bash",
    "description": "Run a shell command.",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}
EDIT = {
    "name": "Edit",
    "description": "Edit a file.",
    "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}},
    "cache_control": CACHE,
}


def claude_code_body(messages: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A request shaped as Claude Code 2.1.337's default first call (trimmed prompts)."""
    return {
        "model": MODEL,
        "max_tokens": 32000,
        "stream": True,
        "system": [
            {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
            {"type": "text", "text": "You are an interactive CLI tool.", "cache_control": CACHE},
        ],
        "messages": messages
        or [
            {
                "role": "user",
                "content": [{"type": "text", "text": "List the files here.", "cache_control": CACHE}],
            },
            {"role": "system", "content": SYSTEM_INSIDE},
            {"role": "user", "content": [{"type": "text", "text": "Be quick."}]},
        ],
        "tools": [BASH, EDIT],
        "metadata": {"user_id": "user_abc_account__session_123"},
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "medium"},
        "temperature": 1,
    }


@pytest.fixture
def served(
    tmp_path: Path, tokenizer: Any, scripted: Any, start_server: Callable[..., BackgroundServer]
) -> Callable[..., tuple[BackgroundServer, Any]]:
    """``served(replies, context_length=None)``: a recording server on the scripted sampler (whose
    ``context_length`` attribute, when given, is the served model's context window)."""

    def start(replies: list[str], context_length: int | None = None) -> tuple[BackgroundServer, Any]:
        sampler = scripted(replies)
        if context_length is not None:
            sampler.context_length = context_length
        recorder = CallRecorder(spans_dir=tmp_path / "spans", schedule_delay_s=0.05)
        server = start_server(PolicyHolder(sampler, tokenizer, MODEL), recorder=recorder)
        server.recorder, server.spans = recorder, tmp_path / "spans"
        return server, sampler

    return start


def sse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """``(event name, data)`` of each event of a named SSE stream."""
    events = []
    for chunk in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.splitlines())
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def test_claude_code_default_request_streams_over_httpx_and_the_sdk(served, tokenizer) -> None:
    server, _ = served(["Here are the files."])
    url = f"{server.url}/rollouts/r-cc/task/t-cc/v1/messages?beta=true"
    answer = httpx.post(url, json=claude_code_body(), headers=HEADERS, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/event-stream")
    events = sse_events(answer.text)
    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(name == data["type"] for name, data in events)
    start, delta = events[0][1]["message"], events[4][1]
    assert delta["delta"]["stop_reason"] == "end_turn" and delta["usage"]["output_tokens"] > 0
    assert events[2][1]["delta"] == {"type": "text_delta", "text": "Here are the files."}
    assert not any(d.get("content_block", {}).get("type") == "thinking" for _, d in events)
    prompt = tokenizer.decode(start["prompt_token_ids"])
    assert SYSTEM_INSIDE in prompt and "interactive CLI tool" in prompt and '"Bash"' in prompt
    assert prompt.index("List the files") < prompt.index(SYSTEM_INSIDE) < prompt.index("Be quick.")

    client = anthropic.Anthropic(base_url=f"{server.url}/rollouts/r-sdk", api_key="k", max_retries=0)
    body = {k: v for k, v in claude_code_body().items() if k not in ("stream", "temperature")}
    with client.beta.messages.stream(**body, betas=BETAS.split(",")) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Here are the files." and final.stop_reason == "end_turn"
    assert final.usage.output_tokens > 0 and final.content[0].type == "text"

    rows = _recorded(server)
    # (a task id defaults to the rollout id)
    assert [(r[0], r[1]) for r in rows] == [("r-cc", "t-cc"), ("r-sdk", "r-sdk")]
    assert all(r[2] for r in rows)  # each recorded with the tokens it sampled


def _recorded(server: BackgroundServer) -> list[tuple]:
    assert server.recorder.flush(30)
    con = duckdb.connect()
    open_spans(con, server.spans)
    return con.execute(
        "SELECT rollout_id, task_id, len(response_token_ids) FROM spans WHERE span_type = 'llm' "
        "ORDER BY start_time"
    ).fetchall()


def test_history_with_thinking_and_tool_results_is_served(served, tokenizer) -> None:
    server, _ = served(["Done."])
    client = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)
    history = [
        {"role": "user", "content": "Count the files, then fix the test."},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "SECRET-THOUGHT", "signature": "sig=="},
                {"type": "text", "text": "Counting."},
                {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {"command": "ls | wc -l"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01",
                    "is_error": True,
                    "content": [
                        {"type": "text", "text": "wc: command failed"},
                        {"type": "text", "text": " (exit 2)", "cache_control": CACHE},
                    ],
                },
                {"type": "text", "text": "Try again.", "cache_control": CACHE},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "redacted_thinking", "data": "ENCRYPTED-BLOB"},
                {"type": "tool_use", "id": "toolu_02", "name": "Bash", "input": {"command": "ls"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_02", "content": "a.py b.py"}],
        },
        {"role": "system", "content": [{"type": "text", "text": "Stay on task.", "cache_control": CACHE}]},
    ]
    message = client.messages.create(
        model=MODEL,
        max_tokens=32000,
        system=[{"type": "text", "text": "You are a coding agent.", "cache_control": CACHE}],
        messages=history,
        tools=[BASH],
        metadata={"user_id": "u"},
        extra_body={"thinking": {"type": "enabled", "budget_tokens": 1024}},
        extra_headers={"anthropic-beta": BETAS},
        timeout=30,
    )
    assert isinstance(message, Message) and message.content[0].text == "Done."
    assert [b.type for b in message.content] == ["text"]
    prompt = tokenizer.decode((message.model_extra or {})["prompt_token_ids"])
    assert "wc: command failed (exit 2)" in prompt and "a.py b.py" in prompt and "Try again." in prompt
    assert '"ls | wc -l"' in prompt and "Stay on task." in prompt
    assert "SECRET-THOUGHT" not in prompt and "ENCRYPTED-BLOB" not in prompt
    assert prompt.index("a.py b.py") < prompt.index("Stay on task.")


def test_over_long_prompt_gets_anthropics_own_error(served, tokenizer) -> None:
    server, _ = served(["never sampled"], context_length=256)
    long_text = "word " * 400
    body = {"model": MODEL, "max_tokens": 32000, "messages": [{"role": "user", "content": long_text}]}
    expected = len(
        server.app.state.endpoint.generator.chat_prompt([{"role": "user", "content": long_text}], None)
    )
    assert expected > 256
    error = {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": f"prompt is too long: {expected} tokens > 255 maximum",
        },
    }
    for stream in (False, True):
        answer = httpx.post(
            f"{server.url}/v1/messages?beta=true",
            json={**body, "stream": stream},
            headers=HEADERS,
            timeout=30,
        )
        assert (answer.status_code, answer.json()) == (400, error)
    client = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match=r"prompt is too long: \d+ tokens > 255 maximum"):
        client.messages.create(**body, timeout=30)


def test_max_tokens_above_the_room_is_clamped(served) -> None:
    server, _ = served(["a " * 500], context_length=300)
    client = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)
    message = client.messages.create(
        model=MODEL, max_tokens=32000, messages=[{"role": "user", "content": "Write a lot."}], timeout=30
    )
    assert message.stop_reason == "max_tokens" and message.content[0].text.startswith("a a")
    assert message.usage.input_tokens + message.usage.output_tokens == 300
    with client.messages.stream(
        model=MODEL, max_tokens=32000, messages=[{"role": "user", "content": "Write a lot."}], timeout=30
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens"
    assert final.usage.input_tokens + final.usage.output_tokens == 300


def test_over_long_prompt_on_the_local_engine(tmp_path: Path, tokenizer, start_server) -> None:
    """The built-in model's own context (its config's ``max_position_embeddings``) bounds the prompt."""
    from tinkertrace.engine import ServiceClient
    from tinkertrace.models.tokenizer import BUILTIN_MODEL

    service = ServiceClient(base_dir=tmp_path / "engine", device="cpu")
    sampler = service.create_sampling_client(base_model=BUILTIN_MODEL).result()
    limit = sampler.model.config.max_position_embeddings
    server = start_server(PolicyHolder(sampler, tokenizer, BUILTIN_MODEL))
    body = {
        "model": BUILTIN_MODEL,
        "max_tokens": 32000,
        "stream": True,
        "messages": [{"role": "user", "content": "word " * (limit + 10)}],
    }
    answer = httpx.post(f"{server.url}/v1/messages?beta=true", json=body, headers=HEADERS, timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].endswith(f"tokens > {limit - 1} maximum")
    assert error["error"]["message"].startswith("prompt is too long: ")


@pytest.mark.parametrize(
    "method, path",
    [
        ("HEAD", "/"),
        ("GET", "/"),
        ("HEAD", "/api/hello"),
        ("GET", "/api/hello"),
        ("HEAD", "/rollouts/r-1/task/t-1"),
        ("HEAD", "/rollouts/r-1/task/t-1/api/hello"),
        ("GET", "/rollouts/r-1/api/hello"),
    ],
)
def test_probes_of_the_base_url_get_200(served, method: str, path: str) -> None:
    server, _ = served(["unused"])
    answer = httpx.request(method, server.url + path, timeout=10)
    assert answer.status_code == 200, answer.text


def test_unknown_paths_under_a_rollout_prefix_are_still_404(served) -> None:
    server, _ = served(["unused"])
    answer = httpx.get(server.url + "/rollouts/r-1/chat/completions", timeout=10)
    assert answer.status_code == 404 and "followed by /v1" in answer.json()["error"]["message"]


LEADING_SYSTEM_ONLY = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' and not loop.first %}"
    "{{ raise_exception('System role only allowed first') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}<|im_start|>assistant\n"
)


def test_system_messages_fold_into_the_system_prompt_where_the_template_refuses_them(
    tokenizer, scripted, start_server
) -> None:
    """A template that allows a system turn only first (as Llama's and Gemma's): the system messages
    inside ``messages`` are appended, in order, to the top-level system prompt."""
    strict = copy.deepcopy(tokenizer)
    strict.chat_template = LEADING_SYSTEM_ONLY
    server = start_server(PolicyHolder(scripted(["ok"]), strict, MODEL))
    answer = httpx.post(f"{server.url}/v1/messages?beta=true", json=claude_code_body(), headers=HEADERS)
    assert answer.status_code == 200, answer.text
    start = sse_events(answer.text)[0][1]["message"]
    prompt = tokenizer.decode(start["prompt_token_ids"])
    system_turn = prompt.split("<|im_end|>")[0]
    assert system_turn.endswith(f"interactive CLI tool.\n\n{SYSTEM_INSIDE}")
    assert prompt.count("<|im_start|>system") == 1


def test_other_methods_under_a_rollout_prefix_are_still_404(served) -> None:
    server, _ = served(["unused"])
    answer = httpx.post(server.url + "/rollouts/r-1/chat/completions", json={}, timeout=10)
    assert answer.status_code == 404 and "followed by /v1" in answer.json()["error"]["message"]


def test_count_tokens_counts_the_prompt_the_request_would_be_given(served) -> None:
    server, _ = served(["Here are the files."])
    client = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)
    body = {k: v for k, v in claude_code_body().items() if k not in ("stream", "temperature", "max_tokens")}
    counting = {k: v for k, v in body.items() if k != "metadata"}  # count_tokens takes no metadata
    counted = client.beta.messages.count_tokens(**counting, betas=BETAS.split(","))
    with client.beta.messages.stream(**body, max_tokens=32000, betas=BETAS.split(",")) as stream:
        final = stream.get_final_message()
    assert counted.input_tokens == final.usage.input_tokens > 0
    url = f"{server.url}/v1/messages/count_tokens?beta=true"
    bad = httpx.post(url, json={"model": MODEL, "messages": []}, timeout=10)
    assert bad.status_code == 400 and bad.json()["type"] == "error"
