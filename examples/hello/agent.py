"""hello: a one-call agent that introduces itself; the reward is how close it comes to a target identity.

The agent is plain OpenAI-client code. ``@traced_rollout`` records its LLM call (token ids and
logprobs) and ``emit_reward`` its score; nothing else here knows about training.
"""

from __future__ import annotations

import difflib
import os
from itertools import takewhile
from typing import Any

import tinkertrace
from examples.common import Chat, user

IDENTITY = os.environ.get("HELLO_IDENTITY", "I am Tinker.")
SYSTEM = "You are a helpful assistant. When asked who you are, introduce yourself in one short sentence."
QUESTIONS = [
    "Who are you?",
    "Introduce yourself.",
    "What is your name?",
    "Tell me about yourself.",
    "Please say who you are.",
    "Hi! Who am I talking to?",
    "What should I call you?",
    "Identify yourself.",
]


def identity_reward(reply: str, target: str = IDENTITY) -> float:
    """Partial credit in [0, 1]: half for the longest common prefix with ``target``, half for the
    character-level similarity of the whole reply (difflib ratio). Exactly ``target`` scores 1."""
    reply = reply.strip()
    prefix = sum(1 for _ in takewhile(lambda pair: pair[0] == pair[1], zip(reply, target, strict=False)))
    similarity = difflib.SequenceMatcher(None, reply, target, autojunk=False).ratio()
    return round(0.5 * prefix / len(target) + 0.5 * similarity, 6)


def load_tasks(split: str = "train") -> list[dict]:
    """Eight questions; the last two are held out as the test split."""
    chosen = QUESTIONS[:6] if split == "train" else QUESTIONS[6:]
    offset = 0 if split == "train" else 6
    return [{"id": f"hello-{offset + i}", "question": q} for i, q in enumerate(chosen)]


@tinkertrace.traced_rollout
def introduce(task: dict, **endpoint: Any) -> dict:
    """Ask the model who it is; reward the answer's closeness to :data:`IDENTITY`.

    ``endpoint``: ``base_url``, ``model`` and optionally ``api_key``, ``temperature``, ``max_tokens``.
    """
    chat = Chat(**endpoint)
    reply = chat.text([{"role": "system", "content": SYSTEM}, user(task["question"])])
    reward = identity_reward(reply)
    tinkertrace.emit_reward(reward)
    return {"reward": reward, "reply": reply}
