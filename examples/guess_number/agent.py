"""guess_number: a multi-turn agent guesses a hidden number from "too high / too low" feedback.

All turns happen in one growing chat, so every prompt extends the previous prompt and reply: the
builder merges the turns of a rollout into one token sequence (a prefix-merged trajectory) with the
feedback tokens masked out. The reward comes once, at the end.
"""

from __future__ import annotations

import random
import re
from typing import Any

import tinkertrace
from examples.common import Chat, user

SYSTEM = (
    "We play a game. I think of a whole number and you guess it. After each guess I say whether it is "
    "too high or too low. Reply with only your guess, a number."
)
NUMBER = re.compile(r"-?\d+")


def load_tasks(split: str = "train", count: int = 32, low: int = 1, high: int = 16) -> list[dict]:
    """Hidden numbers drawn with a fixed seed per split (train and test never share a seed)."""
    rng = random.Random(f"guess_number/{split}")
    return [
        {"id": f"guess-{split}-{i}", "low": low, "high": high, "secret": rng.randint(low, high)}
        for i in range(count)
    ]


def parse_guess(reply: str) -> int | None:
    """The first whole number in ``reply`` (None when there is none or it is absurdly long)."""
    match = NUMBER.search(reply or "")
    if match is None or len(match.group()) > 12:
        return None
    return int(match.group())


def feedback(guess: int | None, secret: int) -> str:
    """What the game master says after a guess."""
    if guess is None:
        return "That is not a number. Reply with only your guess."
    if guess == secret:
        return "Correct!"
    return f"{guess} is too high." if guess > secret else f"{guess} is too low."


def score(guesses: list[int | None], secret: int, low: int, high: int) -> float:
    """1 when the number was found; else partial credit: up to 0.3 for answering with numbers at
    all and up to 0.5 for how close the best guess came."""
    if secret in guesses:
        return 1.0
    valid = [g for g in guesses if g is not None]
    if not guesses or not valid:
        return 0.0
    closest = min(abs(g - secret) for g in valid)
    closeness = max(0.0, 1.0 - closest / max(1, high - low))
    return round(0.3 * len(valid) / len(guesses) + 0.5 * closeness, 6)


@tinkertrace.traced_rollout
def play(task: dict, *, max_turns: int = 4, **endpoint: Any) -> dict:
    """Guess ``task["secret"]`` in at most ``max_turns`` guesses; the reward is :func:`score`."""
    chat = Chat(**{"max_tokens": 8, **endpoint})
    low, high, secret = int(task["low"]), int(task["high"]), int(task["secret"])
    messages = [
        {"role": "system", "content": SYSTEM},
        user(f"I am thinking of a number from {low} to {high}. Your guess?"),
    ]
    guesses: list[int | None] = []
    for _ in range(max_turns):
        reply = chat.text(messages)
        guess = parse_guess(reply)
        guesses.append(guess)
        messages.append({"role": "assistant", "content": reply})
        if guess == secret:
            break
        messages.append(user(feedback(guess, secret)))
    reward = score(guesses, secret, low, high)
    tinkertrace.emit_reward(reward)
    return {"reward": reward, "guesses": guesses}
