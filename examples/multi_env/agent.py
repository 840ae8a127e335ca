"""multi_env: one tool-using agent, several environments (arithmetic with a calculator, spelling with
a letters tool).

The agent is a plain OpenAI tool-calling loop using standard ``tool_calls`` only: it offers the
environment's tools, executes the calls in ``message.tool_calls`` (answered with ``tool`` messages)
and stops at the first reply without one, its final answer. A reply whose tool call the server
could not parse (``finish_reason == "malformed_tool_call"``, see docs/serving.md) earns nothing and
is told so. Each step emits a reward (a small one for a well-formed tool call, the graded answer at
the end); how the
per-step rewards combine, and what a rollout that runs out of steps earns, is set per environment in
``config.yaml``, not here. Running out of steps is reported as a reward named ``truncated``.
"""

from __future__ import annotations

import ast
import difflib
import json
import operator
import random
import re
from dataclasses import dataclass
from typing import Any

import tinkertrace
from examples.common import Chat, function_tool, user

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
WORDS = ["apple", "river", "stone", "cloud", "tiger", "lemon", "piano", "chair", "bread", "light"]


def calculate(expression: str) -> float | None:
    """Value of an integer expression with + - * and parentheses; None for anything else."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, int)
            and not isinstance(node.value, bool)
        ):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError("unsupported")

    if not isinstance(expression, str) or len(expression) > 60:
        return None
    try:
        return walk(ast.parse(expression, mode="eval"))
    except (SyntaxError, ValueError, RecursionError):
        return None


@dataclass
class Step:
    """What the environment answers to a tool call."""

    observation: str
    reward: float


class Arithmetic:
    """Compute an expression; tool ``calculator(expression)``."""

    tools = (
        function_tool("calculator", "Evaluate an arithmetic expression.", expression="e.g. 2 * (3 + 4)"),
    )

    def __init__(self, task: dict) -> None:
        self.expression = task["expression"]
        self.answer = calculate(self.expression)

    def prompt(self) -> str:
        return f"What is {self.expression}? You may use the calculator. Reply with the number."

    def tool(self, name: str, args: dict[str, Any]) -> Step:
        value = calculate(str(args.get("expression", ""))) if name == "calculator" else None
        if value is None:
            return Step("Error: unknown tool or bad expression.", 0.0)
        return Step(f"{value:g}", 0.1)

    def grade(self, reply: str) -> float:
        numbers = NUMBER.findall(reply or "")
        if not numbers or self.answer is None:
            return 0.0
        guess = float(numbers[-1])
        if guess == self.answer:
            return 1.0
        return round(0.1 + 0.4 * max(0.0, 1.0 - abs(guess - self.answer) / max(abs(self.answer), 1.0)), 6)


class Spelling:
    """Spell a word backwards; tool ``letters(word)``."""

    tools = (function_tool("letters", "List the letters of a word.", word="the word"),)

    def __init__(self, task: dict) -> None:
        self.word = task["word"]

    def prompt(self) -> str:
        return f"Spell the word '{self.word}' backwards. Reply with only the reversed word."

    def tool(self, name: str, args: dict[str, Any]) -> Step:
        if name != "letters" or not isinstance(args.get("word"), str):
            return Step("Error: unknown tool or missing word.", 0.0)
        return Step(" ".join(args["word"][:40]), 0.1)

    def grade(self, reply: str) -> float:
        target = self.word[::-1]
        text = (reply or "").strip().lower()
        if text.strip(".!' ") == target:
            return 1.0
        return round(0.8 * difflib.SequenceMatcher(None, text[:40], target, autojunk=False).ratio(), 6)


ENVIRONMENTS: dict[str, type[Arithmetic] | type[Spelling]] = {"arithmetic": Arithmetic, "spelling": Spelling}


def arithmetic_tasks(split: str = "train", count: int = 32) -> list[dict]:
    """Two- and three-term integer expressions, seeded per split."""
    rng = random.Random(f"multi_env/arithmetic/{split}")
    tasks = []
    for i in range(count):
        terms = [str(rng.randint(1, 12)) for _ in range(rng.choice((2, 3)))]
        expression = terms[0] + "".join(f" {rng.choice('+-*')} {t}" for t in terms[1:])
        tasks.append({"id": f"arith-{split}-{i}", "env": "arithmetic", "expression": expression})
    return tasks


def spelling_tasks(split: str = "train") -> list[dict]:
    """Ten words; the last three are the test split."""
    words = WORDS[:7] if split == "train" else WORDS[7:]
    return [{"id": f"spell-{w}", "env": "spelling", "word": w} for w in words]


MALFORMED = "malformed_tool_call"  # the endpoint's finish_reason for a tool call it could not parse


def _arguments(raw: str) -> dict[str, Any]:
    try:
        args = json.loads(raw or "{}")
    except ValueError:
        return {}
    return args if isinstance(args, dict) else {}


@tinkertrace.traced_rollout
def run_episode(task: dict, *, max_steps: int = 3, **endpoint: Any) -> dict[str, Any]:
    """Solve ``task`` in its environment with at most ``max_steps`` model calls."""
    env = ENVIRONMENTS[task["env"]](task)
    chat = Chat(**endpoint)
    messages: list[dict[str, Any]] = [user(env.prompt())]
    rewards: list[float] = []
    for _ in range(max_steps):
        choice = chat.complete(messages, tools=list(env.tools)).choices[0]
        message = choice.message
        messages.append(message.model_dump(exclude_none=True))
        if choice.finish_reason == MALFORMED:
            rewards.append(0.0)
            tinkertrace.emit_reward(0.0)
            messages.append(user("Error: that tool call could not be parsed."))
            continue
        if not message.tool_calls:
            reward = env.grade(message.content or "")
            tinkertrace.emit_reward(reward)
            rewards.append(reward)
            return {"reward": reward, "terminal": True, "step_rewards": rewards}
        for call in message.tool_calls:
            step = env.tool(call.function.name, _arguments(call.function.arguments))
            rewards.append(step.reward)
            tinkertrace.emit_reward(step.reward)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": step.observation})
    tinkertrace.emit_reward(1.0, name="truncated")
    return {"reward": 0.0, "terminal": False, "step_rewards": rewards}
