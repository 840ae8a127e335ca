"""solver_judge: several solvers propose Countdown answers, a judge picks one.

Per episode: ``num_solvers`` calls under agent name ``solver`` (each rewarded for its own expression)
and one call under agent name ``judge`` (rewarded for the answer it chose). Rewards are emitted inside
each agent's span, so the builder groups and normalises them per task *and* agent name. The episode's
return value, 1 when the chosen answer is correct, is what ``tinkertrace eval`` counts for pass@k.
"""

from __future__ import annotations

import ast
import asyncio
import operator
import random
import re
from collections import Counter
from typing import Any

import tinkertrace
from examples.common import AsyncChat, user

SOLVER_PROMPT = (
    "Use some of the numbers {numbers} once each, with + - * / and parentheses, to make {target}. "
    "Reply with only the expression."
)
JUDGE_PROMPT = (
    "Numbers {numbers}, target {target}. Candidate answers:\n{candidates}\n"
    "Which candidate is correct? Reply with only its number."
)
EXPRESSION_CHARS = re.compile(r"[0-9+\-*/() ]+")
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def make_task(rng: random.Random, task_id: str, count: int = 3) -> dict:
    """Numbers 1..9 and a target reached by combining them left to right with random operators."""
    numbers = [rng.randint(1, 9) for _ in range(count)]
    target = numbers[0]
    for n in numbers[1:]:
        op = rng.choice("+-*")
        target = target + n if op == "+" else target - n if op == "-" else target * n
    if target <= 0:
        target = sum(numbers)
    return {"id": task_id, "numbers": numbers, "target": target}


def load_tasks(split: str = "train", count: int = 64, seed: int = 0) -> list[dict]:
    """Countdown tasks generated locally; each split has its own seed."""
    rng = random.Random(f"countdown/{split}/{seed}")
    return [make_task(rng, f"countdown-{split}-{i}") for i in range(count)]


def load_short_tasks(split: str = "train", count: int = 64, seed: int = 0) -> list[dict]:
    """The short form: two numbers per task (the target is their sum, difference or product), for
    a small model on a CPU (see the README's SmolLM2 section)."""
    rng = random.Random(f"countdown-short/{split}/{seed}")
    return [make_task(rng, f"countdown-short-{split}-{i}", count=2) for i in range(count)]


def _evaluate(node: ast.AST, used: list[int]) -> float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, used)
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        used.append(node.value)
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](_evaluate(node.left, used), _evaluate(node.right, used))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand, used)
    raise ValueError("unsupported expression")


def parse_expression(reply: str) -> tuple[str, float, list[int]] | None:
    """The longest arithmetic-looking run in ``reply``, its value and the numbers it uses; None when
    nothing in it evaluates (junk, division by zero, too long)."""
    runs = sorted((m.group().strip() for m in EXPRESSION_CHARS.finditer(reply or "")), key=len, reverse=True)
    for text in runs:
        if not text or len(text) > 80 or not any(ch.isdigit() for ch in text):
            continue
        used: list[int] = []
        try:
            value = _evaluate(ast.parse(text, mode="eval"), used)
        except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, OverflowError):
            continue
        return text, value, used
    return None


def solver_reward(reply: str, numbers: list[int], target: int) -> float:
    """1 for a correct expression using only the given numbers; partial credit otherwise: 0.1 for
    any expression, up to 0.2 for using allowed numbers, up to 0.3 for getting close to the target."""
    parsed = parse_expression(reply)
    if parsed is None:
        return 0.0
    _, value, used = parsed
    allowed = not (Counter(used) - Counter(numbers))
    if allowed and abs(value - target) < 1e-9:
        return 1.0
    overlap = sum((Counter(used) & Counter(numbers)).values()) / max(len(used), 1)
    closeness = max(0.0, 1.0 - abs(value - target) / max(abs(target), 1))
    return round(0.1 + 0.2 * overlap + 0.3 * closeness * allowed, 6)


def parse_choice(reply: str, count: int) -> int | None:
    """The judge's pick as a 0-based index (the first number 1..count in the reply)."""
    for match in re.finditer(r"\d+", reply or ""):
        if 1 <= int(match.group()) <= count:
            return int(match.group()) - 1
    return None


@tinkertrace.traced_rollout
async def solve(task: dict, *, num_solvers: int = 3, **endpoint: Any) -> dict[str, Any]:
    """Run the solvers concurrently, then the judge; return the episode's reward (chosen answer correct)."""
    chat = AsyncChat(**endpoint)
    numbers, target = list(task["numbers"]), int(task["target"])
    prompt = SOLVER_PROMPT.format(numbers=numbers, target=target)

    async def one_solver() -> tuple[str, float]:
        with tinkertrace.agent_span("solver"):
            completion = await chat.complete([user(prompt)])
            answer = completion.choices[0].message.content or ""
            reward = solver_reward(answer, numbers, target)
            tinkertrace.emit_reward(reward, response_id=completion.id)
            return answer, reward

    proposals = await asyncio.gather(*(one_solver() for _ in range(num_solvers)))
    candidates = "\n".join(f"{i + 1}. {answer.strip()[:60]}" for i, (answer, _) in enumerate(proposals))
    with tinkertrace.agent_span("judge"):
        question = JUDGE_PROMPT.format(numbers=numbers, target=target, candidates=candidates)
        completion = await chat.complete([user(question)], max_tokens=4)
        choice = parse_choice(completion.choices[0].message.content or "", len(proposals))
        chosen_reward = proposals[choice][1] if choice is not None else 0.0
        tinkertrace.emit_reward(chosen_reward, response_id=completion.id)
    return {
        "reward": 1.0 if chosen_reward == 1.0 else 0.0,
        "choice": choice,
        "solver_rewards": [r for _, r in proposals],
    }
