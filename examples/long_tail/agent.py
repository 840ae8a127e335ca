"""A long-tail multi-turn task: episodes of 1 to 10 turns, most short, a few long.

Each rollout is one chat in which the agent is asked who it is, then asked again ("Once more: who are
you?") for as many turns as the episode lasts; the reward, given once at the end, is the mean of the
identity reward (:func:`tinkertrace.online.demo_agent.identity_reward`, partial credit per character)
over the turns. The number of turns is drawn per rollout from a truncated power law,
``P(k) ∝ k^-1.5`` for ``k = 1..10`` (mean 2.5; one episode in three lasts 3 turns or more, about one
in twelve lasts 7 or more), so a group of 8 usually holds one long episode: a synchronous step waits for
it, and a drop-stale policy throws exactly such episodes away. Every prompt extends the previous
prompt and reply, so the builder merges an episode's turns into one trajectory.

The built-in model learns the reply from scratch (as in ``tinkertrace demo``); SmolLM2-135M-Instruct
starts with some partial credit. Real agents wait between turns for their tools; the environment
variable ``TINKERTRACE_LONG_TAIL_TOOL_S`` (seconds, default 0) makes every turn after the first wait
that long before it is asked, as a tool call would (``benchmarks/async_vs_sync.py --tool-seconds``),
so a long episode is long in wall time even where decoding is cheap. Run as a worker process like the
demo's agents (same options)::

    PYTHONPATH=. python -m examples.long_tail.agent --base-url http://127.0.0.1:8000/v1 \
        --collector http://127.0.0.1:4318 --worker 0 --log agents-0.jsonl

``benchmarks/async_vs_sync.py`` runs it under the synchronous, drop and corrected modes.
"""

from __future__ import annotations

import itertools
import os
import random
import time
from typing import Any

from openai import OpenAI

import tinkertrace
from tinkertrace.online.demo_agent import DemoTask, identity_reward, main, scored

MAX_TURNS = 10
TAIL_EXPONENT = 1.5
FIRST = "Who are you?"
AGAIN = "Once more: who are you?"
TOOL_ENV = "TINKERTRACE_LONG_TAIL_TOOL_S"
_draws = itertools.count()  # rollouts of one process draw their lengths from distinct seeds


def turn_weights(max_turns: int = MAX_TURNS, exponent: float = TAIL_EXPONENT) -> list[float]:
    """``P(k)`` for ``k = 1..max_turns``: proportional to ``k ** -exponent``."""
    raw = [k**-exponent for k in range(1, max_turns + 1)]
    return [w / sum(raw) for w in raw]


def episode_turns(seed: str) -> int:
    """The number of turns of the episode seeded by ``seed``."""
    return random.Random(seed).choices(range(1, MAX_TURNS + 1), weights=turn_weights())[0]


def long_tail_task(worker: int, round_: int, seed: int = 0) -> dict[str, Any]:
    """Worker ``worker``'s round ``round_`` (one group) of the run seeded by ``seed``."""
    return {"id": f"longtail-s{seed}-w{worker}-r{round_}"}


@tinkertrace.traced_rollout
def episode(
    task: dict, *, client: OpenAI, model: str, max_tokens: int, seed: int | None = None
) -> dict[str, Any]:
    """One episode: ask, then ask again, for its drawn number of turns; emit the mean reward."""
    turns = episode_turns(f"{task['id']}/{next(_draws)}")
    tool_s = float(os.environ.get(TOOL_ENV) or 0)
    messages: list[dict[str, str]] = []
    rewards, tokens, versions = [], 0, []
    for turn in range(turns):
        if turn and tool_s > 0:
            time.sleep(tool_s)  # the tool call whose result the next turn would carry
        messages.append({"role": "user", "content": FIRST if turn == 0 else AGAIN})
        completion = client.chat.completions.create(
            model=model,
            messages=messages,
            temperature=1.0,
            max_tokens=max_tokens,
            seed=seed,  # type: ignore[arg-type]
        )
        reply = completion.choices[0].message.content or ""
        messages.append({"role": "assistant", "content": reply})
        rewards.append(identity_reward(reply))
        tokens += completion.usage.completion_tokens if completion.usage else 0
        versions.append(getattr(completion, "policy_version", None))
    row = scored(sum(rewards) / turns, messages[-1]["content"], tokens, versions[0])
    return {**row, "turns": turns, "policy_versions": versions}


DEMO_TASK = DemoTask(long_tail_task, episode)

if __name__ == "__main__":
    main(DEMO_TASK)
