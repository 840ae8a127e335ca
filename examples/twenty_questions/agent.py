"""twenty_questions: a player asks yes/no questions of an answerer to find a hidden noun.

Two roles, two model calls per question, both traced: the *player* (agent name ``player``, the one we
train) and the *answerer* (agent name ``answerer``, who knows the secret). The builder keeps only the
player's calls with ``--agent player``. The player may call a mock ``search`` tool (OpenAI tool calls,
executed locally; ``<tool_call>`` text from servers without tool-call parsing works the same way,
see :func:`examples.common.tool_calls`).
"""

from __future__ import annotations

import csv
import difflib
import re
from collections.abc import Collection
from functools import cache
from pathlib import Path
from typing import Any

import tinkertrace
from examples.common import Chat, answer_tool_calls, function_tool, tool_calls, user

WORDS_CSV = Path(__file__).with_name("words.csv")
PLAYER_SYSTEM = (
    "We play twenty questions. I am thinking of a {category}. Ask one yes/no question per turn to find "
    "out which one. When you know it, say 'Is it a <noun>?'."
)
ANSWERER_SYSTEM = "The secret {category} is '{answer}'. Answer the question with only 'yes' or 'no'."
SEARCH_TOOL = function_tool(
    "search", "Look up which nouns belong to a category.", query="a category, e.g. 'fruit'"
)
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


def nouns(category: str) -> list[str]:
    """Every noun of ``category`` in the CSV (both splits), sorted."""
    return sorted({row["answer"] for row in _rows() if row["category"] == category})


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


def score(questions: list[str], answer: str, found: bool, listed: Collection[str] = ()) -> float:
    """1 when the noun was named; else up to 0.4 for the closest word to it and, as shares of the
    questions, up to 0.1 for asking in question form and up to 0.2 for naming one of the ``listed``
    nouns (the candidates, when the player was shown them)."""
    if found:
        return 1.0
    if not questions:
        return 0.0
    words = [set(WORD.findall(q.lower())) for q in questions]  # each question's words
    closest = max((difflib.SequenceMatcher(None, w, answer).ratio() for ws in words for w in ws), default=0.0)
    asked = sum(q.strip().endswith("?") for q in questions) / len(questions)
    named = sum(not ws.isdisjoint(listed) for ws in words) / len(questions)
    return round(0.4 * closest + 0.1 * asked + 0.2 * named, 6)


def _player_turn(chat: Chat, messages: list[dict], use_search: bool) -> tuple[str, str | None]:
    """One player move as (text, response id); search tool calls are executed and answered first."""
    response_id = None
    for _ in range(2):  # at most one search round per question
        with tinkertrace.agent_span("player"):
            completion = chat.complete(messages, **({"tools": [SEARCH_TOOL]} if use_search else {}))
        response_id = completion.id
        message = completion.choices[0].message
        calls = tool_calls(message) if use_search else []
        if calls:
            results = [
                search(args.get("query", "")) if name == "search" else "Unknown tool."
                for _, name, args in calls
            ]
            messages.extend(answer_tool_calls(message, calls, results))
            continue
        text = message.content or ""
        messages.append({"role": "assistant", "content": text})
        return text, response_id
    return "", response_id


@tinkertrace.traced_rollout
def play(
    task: dict,
    *,
    max_questions: int = 5,
    use_search: bool = True,
    answerer_model: str | None = None,
    **endpoint: Any,
) -> dict:
    """Find ``task["answer"]`` within ``max_questions`` questions; the player is rewarded by :func:`score`."""
    chat = Chat(**endpoint)
    category, answer = task["category"], task["answer"]
    messages = [{"role": "system", "content": PLAYER_SYSTEM.format(category=category)}]
    messages.append(user("Ask your first question."))
    questions: list[str] = []
    found = False
    last_response: str | None = None
    for _ in range(max_questions):
        question, last_response = _player_turn(chat, messages, use_search)
        questions.append(question)
        if answer in WORD.findall(question.lower()):
            found = True
            break
        with tinkertrace.agent_span("answerer"):
            judged = chat.text(
                [
                    {"role": "system", "content": ANSWERER_SYSTEM.format(category=category, answer=answer)},
                    user(question or "(no question)"),
                ],
                model=answerer_model or chat.model,
                temperature=0.0,
                max_tokens=4,
            )
        messages.append(user(parse_answer(judged)))
    reward = score(questions, answer, found)
    with tinkertrace.agent_span("player"):
        tinkertrace.emit_reward(reward, response_id=last_response)  # the player's last move earns it
    return {"reward": reward, "found": found, "questions": len(questions)}
