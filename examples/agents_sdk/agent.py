"""agents_sdk: an arithmetic agent written with the OpenAI Agents SDK, trained unchanged.

The agent is ordinary Agents SDK code: an ``Agent`` with instructions and one ``@function_tool``
(a calculator), run by ``Runner.run`` on the SDK's default model class for a model name, the
Responses API (``OpenAIResponsesModel``), against any OpenAI-compatible endpoint. The only
tinkertrace lines are ``@tinkertrace.traced_rollout`` on the rollout function and
``emit_reward``: the SDK's ``/v1/responses`` calls are captured with their token ids like any
other OpenAI call, and the endpoint's structured tool calls drive the SDK's tool loop.

Runs in its own environment (openai-agents needs ``openai<3``): see README.md.
"""

from __future__ import annotations

import ast
import asyncio
import operator
import random
import re
from typing import Any

from agents import Agent, ModelSettings, RunConfig, Runner, function_tool
from agents.exceptions import AgentsException
from agents.models.openai_provider import OpenAIProvider
from openai import AsyncOpenAI

import tinkertrace

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
INSTRUCTIONS = "Answer the arithmetic question with a number. Use the calculator tool for the sum."


def evaluate(expression: str) -> float:
    """Value of an integer expression with + - * and parentheses (ValueError for anything else)."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        raise ValueError(f"not an integer expression: {expression!r}")

    if len(expression) > 60:
        raise ValueError("expression too long")
    try:
        return walk(ast.parse(expression, mode="eval"))
    except (SyntaxError, RecursionError) as exc:
        raise ValueError(f"not an integer expression: {expression!r}") from exc


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an integer arithmetic expression such as 2 * (3 + 4).

    Args:
        expression: the expression to evaluate.
    """
    try:
        return f"{evaluate(expression):g}"
    except ValueError as exc:
        return f"Error: {exc}"


def load_tasks(split: str = "train", count: int = 16) -> list[dict]:
    """Two-term integer expressions, seeded per split."""
    rng = random.Random(f"agents_sdk/{split}")
    tasks = []
    for i in range(count):
        a, b, op = rng.randint(2, 30), rng.randint(2, 30), rng.choice("+-*")
        tasks.append({"id": f"agents-sdk-{split}-{i}", "expression": f"{a} {op} {b}"})
    return tasks


def grade(answer: str, expression: str) -> float:
    """1 for the right number (the last one in the answer), partial credit for a near one."""
    numbers = NUMBER.findall(answer or "")
    if not numbers:
        return 0.0
    target, guess = evaluate(expression), float(numbers[-1])
    if guess == target:
        return 1.0
    return round(0.5 * max(0.0, 1.0 - abs(guess - target) / max(abs(target), 1.0)), 6)


def make_agent(model: str, temperature: float, max_tokens: int) -> Agent:
    """The agent: nothing here knows about training."""
    settings = ModelSettings(temperature=temperature, max_tokens=max_tokens)
    return Agent(
        name="calculator_agent",
        instructions=INSTRUCTIONS,
        tools=[calculator],
        model=model,
        model_settings=settings,
    )


async def ask(
    agent: Agent, question: str, *, base_url: str, api_key: str, max_turns: int, stream: bool = False
) -> str:
    """Run ``agent`` on ``question`` with the SDK's Responses model against ``base_url``
    (``stream``: with ``Runner.run_streamed``, reading its events as a UI would)."""
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=2) as client:
        provider = OpenAIProvider(openai_client=client, use_responses=True)
        run_config = RunConfig(model_provider=provider, tracing_disabled=True)
        if not stream:
            result = await Runner.run(agent, question, max_turns=max_turns, run_config=run_config)
            return str(result.final_output or "")
        streamed = Runner.run_streamed(agent, question, max_turns=max_turns, run_config=run_config)
        async for _event in streamed.stream_events():
            pass
        return str(streamed.final_output or "")


@tinkertrace.traced_rollout
def solve(
    task: dict,
    *,
    base_url: str,
    model: str,
    api_key: str = "EMPTY",
    temperature: float = 1.0,
    max_tokens: int = 96,
    max_turns: int = 3,
    stream: bool = False,
) -> dict[str, Any]:
    """Run the agent on one question against the endpoint at ``base_url``; reward the answer."""
    agent = make_agent(model, temperature, max_tokens)
    question = f"What is {task['expression']}?"
    try:
        answer = asyncio.run(
            ask(agent, question, base_url=base_url, api_key=api_key, max_turns=max_turns, stream=stream)
        )
        finished = True
    except AgentsException:  # ran out of turns, or a tool call the SDK could not use
        answer, finished = "", False
    reward = grade(answer, task["expression"])
    tinkertrace.emit_reward(reward)
    return {"reward": reward, "answer": answer, "finished": finished}
