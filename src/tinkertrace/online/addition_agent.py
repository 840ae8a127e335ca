"""The demo task for a pretrained model: answer a sum with only the number.

Asked "What is 7 + 5? Reply with only the number.", a pretrained chat model such as
SmolLM2-135M-Instruct mostly explains instead, and at temperature 1 often gets the sum wrong. The
reward pays the exact sum alone most, the sum inside other text half, and a bare wrong number a
little (the format is half the task). Each round's sum is drawn from a seed of the run, the worker
and the round, so a worker's rounds differ and a group shares one. HELDOUT_PAIRS, 16 of the 81
sums, are never drawn: the held-out accuracy (:mod:`tinkertrace.online.heldout`) asks them. Run as
a worker process like :mod:`tinkertrace.online.demo_agent` (same options)::

    python -m tinkertrace.online.addition_agent --base-url http://127.0.0.1:8000/v1 \
        --collector http://127.0.0.1:4318 --model smollm2-135m-instruct --worker 0 --log agents-0.jsonl
"""

from __future__ import annotations

import random
import re
from typing import Any

from openai import OpenAI

import tinkertrace
from tinkertrace.online.demo_agent import DemoTask, ask, main, scored

QUESTION = "What is {a} + {b}? Reply with only the number."
LARGEST_TERM = 9
NUMBER = re.compile(r"-?\d+")


def addition_reward(reply: str, answer: int) -> float:
    """1 for exactly the answer (a trailing full stop allowed), 0.5 for the answer among other text,
    0.1 for a bare wrong number, 0 otherwise."""
    text = reply.strip().removesuffix(".").strip()
    if NUMBER.fullmatch(text):
        return 1.0 if int(text) == answer else 0.1
    return 0.5 if str(answer) in NUMBER.findall(reply) else 0.0


ALL_PAIRS = [(a, b) for a in range(1, LARGEST_TERM + 1) for b in range(1, LARGEST_TERM + 1)]
HELDOUT_PAIRS = sorted(random.Random("addition/heldout").sample(ALL_PAIRS, 16))
TRAINING_PAIRS = [pair for pair in ALL_PAIRS if pair not in HELDOUT_PAIRS]


def sum_task(a: int, b: int, task_id: str) -> dict[str, Any]:
    """The task of asking ``a + b``."""
    return {"id": task_id, "question": QUESTION.format(a=a, b=b), "answer": a + b}


def addition_task(worker: int, round_: int, seed: int = 0) -> dict[str, Any]:
    """Worker ``worker``'s round ``round_``: a sum of two numbers from 1 to LARGEST_TERM, never one of
    HELDOUT_PAIRS."""
    a, b = random.Random(f"addition/{seed}/{worker}/{round_}").choice(TRAINING_PAIRS)
    return sum_task(a, b, f"add-{a}-{b}-w{worker}-r{round_}")


def states_the_sum(reply: str, task: dict[str, Any]) -> bool:
    """Whether ``reply`` gives the right sum (alone or among other text)."""
    return addition_reward(reply, task["answer"]) >= 0.5


@tinkertrace.traced_rollout
def add(
    task: dict, *, client: OpenAI, model: str, max_tokens: int, seed: int | None = None
) -> dict[str, Any]:
    """Ask the sum; emit and return the reward of the reply."""
    reply, tokens, version = ask(client, model, task["question"], max_tokens, seed)
    return scored(addition_reward(reply, task["answer"]), reply, tokens, version)


DEMO_TASK = DemoTask(
    addition_task,
    add,
    heldout=tuple(sum_task(a, b, f"heldout-{a}-{b}") for a, b in HELDOUT_PAIRS),
    reward=lambda reply, task: addition_reward(reply, task["answer"]),
    correct=states_the_sum,
    correct_means="states the sum",
)

if __name__ == "__main__":
    main(DEMO_TASK)
