"""twenty_questions: a player asks yes/no questions of an answerer to find a hidden noun.

Two roles, two model calls per question, both traced: the *player* (agent name ``player``, the one we
train) and the *answerer* (agent name ``answerer``, who knows the secret). The builder keeps only the
player's calls with ``--agent player``. The player may call a mock ``search`` tool (OpenAI tool calls,
executed locally); a server without tool-call parsing may instead answer with a
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` text block, which is handled the same way.
"""

from __future__ import annotations

import csv
import difflib
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from openai import OpenAI

import tinkertrace

WORDS_CSV = Path(__file__).with_name("words.csv")
PLAYER_SYSTEM = (
    "We play twenty questions. I am thinking of a {category}. Ask one yes/no question per turn to find "
    "out which one. When you know it, say 'Is it a <noun>?'."
)
ANSWERER_SYSTEM = "The secret {category} is '{answer}'. Answer the question with only 'yes' or 'no'."
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Look up which nouns belong to a category.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "a category, e.g. 'fruit'"}},
            "required": ["query"],
        },
    },
}
TEXT_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
WORD = re.compile(r"[a-z]+")


@cache
def _rows() -> tuple[dict[str, str], ...]:
    with WORDS_CSV.open(newline="") as handle:
        return tuple(csv.DictReader(handle))


def load_tasks(split: str = "train") -> list[dict]:
    """The CSV's rows of ``split`` (``train`` or ``test``) as tasks."""
    return [
        {"id": f"20q-{row['answer']}", "category": row["category"], "answer": row["answer"]}
        for row in _rows()
        if row["split"] == split
    ]


def search(query: str) -> str:
    """The mock search tool: the nouns of every category named in ``query``."""
    words = set(WORD.findall(str(query).lower()))
    found = sorted({row["answer"] for row in _rows() if row["category"] in words})
    return "Results: " + ", ".join(found) if found else "No results."


def parse_answer(reply: str) -> str:
    """The answerer's reply reduced to 'Yes.', 'No.' or "I don't know." (junk is "I don't know.")."""
    words = WORD.findall((reply or "").lower())
    if words and words[0] in ("yes", "no"):
        return words[0].capitalize() + "."
    return "I don't know."


def text_tool_calls(reply: str) -> list[tuple[str, dict[str, Any]]]:
    """``<tool_call>`` blocks in a text reply as (name, arguments); malformed blocks are skipped."""
    calls = []
    for block in TEXT_TOOL_CALL.findall(reply or ""):
        try:
            parsed = json.loads(block)
            name, args = str(parsed["name"]), parsed.get("arguments", {})
        except (ValueError, KeyError, TypeError):
            continue
        calls.append((name, args if isinstance(args, dict) else {}))
    return calls


def score(questions: list[str], answer: str, found: bool) -> float:
    """1 when the noun was named; else up to 0.4 for the closest word to it and up to 0.1 for
    asking in question form."""
    if found:
        return 1.0
    if not questions:
        return 0.0
    words = [w for q in questions for w in WORD.findall(q.lower())]
    closest = max((difflib.SequenceMatcher(None, w, answer).ratio() for w in words), default=0.0)
    asked = sum(q.strip().endswith("?") for q in questions) / len(questions)
    return round(0.4 * closest + 0.1 * asked, 6)


def _player_turn(
    client: OpenAI, model: str, messages: list[dict], use_search: bool, **sampling: Any
) -> tuple[str, str | None]:
    """One player move as (text, response id); search tool calls are executed and answered first."""
    response_id = None
    for _ in range(2):  # at most one search round per question
        with tinkertrace.agent_span("player"):
            kwargs = {"tools": [SEARCH_TOOL]} if use_search else {}
            message = client.chat.completions.create(model=model, messages=messages, **sampling, **kwargs)
        response_id = message.id
        reply = message.choices[0].message
        text = reply.content or ""
        if use_search and reply.tool_calls:
            messages.append(reply.model_dump(exclude_none=True))
            for call in reply.tool_calls:
                try:
                    query = json.loads(call.function.arguments or "{}").get("query", "")
                except (ValueError, AttributeError):
                    query = ""
                messages.append({"role": "tool", "tool_call_id": call.id, "content": search(query)})
            continue
        calls = text_tool_calls(text) if use_search else []
        if calls:
            messages.append({"role": "assistant", "content": text})
            results = [search(args.get("query", "")) for name, args in calls if name == "search"]
            messages.append({"role": "user", "content": "\n".join(results) or "Unknown tool."})
            continue
        messages.append({"role": "assistant", "content": text})
        return text, response_id
    return "", response_id


@tinkertrace.traced_rollout
def play(
    task: dict,
    *,
    base_url: str,
    model: str,
    api_key: str = "EMPTY",
    temperature: float = 1.0,
    max_questions: int = 5,
    max_tokens: int = 24,
    use_search: bool = True,
    answerer_model: str | None = None,
) -> dict:
    """Find ``task["answer"]`` within ``max_questions`` questions; the player is rewarded by :func:`score`."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=2)
    category, answer = task["category"], task["answer"]
    messages = [{"role": "system", "content": PLAYER_SYSTEM.format(category=category)}]
    messages.append({"role": "user", "content": "Ask your first question."})
    questions: list[str] = []
    found = False
    last_response: str | None = None
    for _ in range(max_questions):
        question, last_response = _player_turn(
            client, model, messages, use_search, temperature=temperature, max_tokens=max_tokens
        )
        questions.append(question)
        if answer in WORD.findall(question.lower()):
            found = True
            break
        with tinkertrace.agent_span("answerer"):
            judged = client.chat.completions.create(
                model=answerer_model or model,
                messages=[
                    {"role": "system", "content": ANSWERER_SYSTEM.format(category=category, answer=answer)},
                    {"role": "user", "content": question or "(no question)"},
                ],
                temperature=0.0,
                max_tokens=4,
            )
        messages.append({"role": "user", "content": parse_answer(judged.choices[0].message.content or "")})
    reward = score(questions, answer, found)
    with tinkertrace.agent_span("player"):
        tinkertrace.emit_reward(reward, response_id=last_response)  # the player's last move earns it
    return {"reward": reward, "found": found, "questions": len(questions)}
