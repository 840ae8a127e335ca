"""The builder on a real BPE vocabulary (Qwen's, from the dashscope package, built offline): the
test server tokenises with it, the SDK re-tokenises with it when the server sends no ids, and the
trajectories show what BPE does to a conversation's turns."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

import tinkertrace
from tinkertrace.builder import BuildSettings, build_trajectories
from tinkertrace.models.tokenizer import load_tokenizer
from tinkertrace.testing.bpe import save_qwen_tokenizer
from tinkertrace.testing.openai_server import scripted_responder

Msgs = list[dict[str, Any]]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
        },
    }
]


@pytest.fixture(scope="session")
def qwen_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The Qwen BPE tokenizer saved twice: ChatML with tools, and Qwen3's think-dropping template."""
    root = tmp_path_factory.mktemp("qwen")
    return {
        "chatml": save_qwen_tokenizer(root / "chatml"),
        "qwen3": save_qwen_tokenizer(root / "qwen3", drop_past_think=True),
    }


@pytest.fixture
def qwen(qwen_dirs: dict[str, Path], openai_server: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The server tokenising with the ChatML Qwen tokenizer; the SDK writing spans under tmp_path."""
    tok = load_tokenizer(str(qwen_dirs["chatml"]))
    openai_server.options.tokenizer = tok
    spans = tmp_path / "spans"
    tinkertrace.init(spans_dir=spans, tokenizer=str(qwen_dirs["chatml"]))
    client = openai.OpenAI(base_url=openai_server.base_url, api_key="test")
    yield {"tok": tok, "spans": spans, "client": client, "server": openai_server}
    tinkertrace.shutdown()


def template_ids(tok: Any, messages: Msgs, tools: Any = None) -> list[int]:
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return list(tok.encode(text, add_special_tokens=False))


def chat_rollout(q: dict[str, Any], questions: list[str]) -> list[str]:
    """One traced rollout of a multi-turn chat with tools; returns the replies."""
    replies: list[str] = []

    @tinkertrace.traced_rollout
    def solve(task: dict[str, str]) -> float:
        msgs: Msgs = [{"role": "system", "content": "You add numbers."}]
        for question in questions:
            msgs.append({"role": "user", "content": question})
            r = q["client"].chat.completions.create(model="test-model", messages=msgs, tools=TOOLS)
            replies.append(r.choices[0].message.content or "")
            msgs.append({"role": "assistant", "content": replies[-1]})
        return 1.0

    solve({"id": "bpe"})
    return replies


def run(q: dict[str, Any], replies: list[str], questions: list[str]) -> tuple[Any, list[dict[str, Any]]]:
    """The server answers ``replies`` to a chat of ``questions``; returns the build and its triplets."""
    q["server"].options.responder = scripted_responder(replies)
    chat_rollout(q, questions)
    tinkertrace.flush()
    result = build_trajectories(q["spans"], None, BuildSettings())
    return result, result.triplets.to_pylist()


def split_reasons(result: Any) -> list[tuple[int, str | None]]:
    return [(r["segment"], r["split_reason"]) for r in result.trajectories.drop(["end_time"]).to_pylist()]


def test_server_ids_merge_turns_into_one_trajectory(qwen: dict[str, Any]) -> None:
    result, trips = run(qwen, ["The sum is 4.", "It is 10, tokenised."], ["What is 2+2?", "And 3+7?"])
    tok = qwen["tok"]
    assert [t["token_source"] for t in trips] == ["server", "server"]
    first = [{"role": "system", "content": "You add numbers."}, {"role": "user", "content": "What is 2+2?"}]
    assert trips[0]["prompt_token_ids"] == template_ids(tok, first, TOOLS)
    assert trips[0]["response_token_ids"] == tok.encode("The sum is 4.", add_special_tokens=False)
    # real merges: far fewer tokens than bytes
    assert len(trips[1]["prompt_token_ids"]) < len(tok.decode(trips[1]["prompt_token_ids"]).encode()) / 2
    (traj,) = result.trajectories.drop(["end_time"]).to_pylist()
    assert (traj["num_turns"], traj["split_reason"]) == (2, None)
    assert traj["tokens"] == trips[1]["prompt_token_ids"] + trips[1]["response_token_ids"]


def test_reply_that_bpe_merges_with_the_template_is_diagnosed_as_drift(qwen: dict[str, Any]) -> None:
    # the reply starts with newlines: after "assistant\n" in the next prompt they merge into one token
    result, _ = run(qwen, ["\n\n4", "10"], ["2+2?", "3+7?"])
    assert split_reasons(result) == [(0, None), (1, "retokenization_drift")]
    assert result.summary.trajectory_splits == {"retokenization_drift": 1}


def test_retokenize_fallback_gives_the_templates_ids(qwen: dict[str, Any]) -> None:
    qwen["server"].options.token_ids = False  # a server without the extension: the SDK re-tokenises
    result, trips = run(qwen, ["Four.", "Ten."], ["What is 2+2?", "And 3+7?"])
    tok = qwen["tok"]
    assert [t["token_source"] for t in trips] == ["retokenized", "retokenized"]
    msgs: Msgs = [
        {"role": "system", "content": "You add numbers."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "Four."},
        {"role": "user", "content": "And 3+7?"},
    ]
    assert trips[1]["prompt_token_ids"] == template_ids(tok, msgs, TOOLS)
    assert trips[1]["response_token_ids"] == tok.encode("Ten.", add_special_tokens=False)
    assert [r["num_turns"] for r in result.trajectories.drop(["end_time"]).to_pylist()] == [2]


def test_template_dropping_past_thinking_is_a_template_change(
    qwen: dict[str, Any], qwen_dirs: dict[str, Path]
) -> None:
    qwen["server"].options.tokenizer = load_tokenizer(str(qwen_dirs["qwen3"]))
    replies = ["<think>\nTwo and two.\n</think>\n\n4", "<think>\nThree and seven.\n</think>\n\n10"]
    result, _ = run(qwen, replies, ["2+2?", "3+7?"])
    assert split_reasons(result) == [(0, None), (1, "template_change")]
