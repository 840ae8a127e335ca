"""Two OpenReward environments written with the real ``openreward`` package (served by ``server.py``).

- ``arithmetic``: one question (``a + b`` or ``a * b`` with small numbers); the one tool
  ``submit(answer)`` grades it (1 for the exact number, partial credit for a close one) and ends the
  episode.
- ``whodunit``: a small murder mystery in the spirit of GeneralReasoning/WhoDunIt. Clue tools
  (``alibis``, ``witness``, ``evidence``) return text, and the first use of each earns a partial
  reward of 0.1; ``accuse(name)`` ends the episode with 1 for the culprit, 0 otherwise.

Tasks are generated from a seed per split (``train``, ``test``), so both splits are fixed lists.
"""

from __future__ import annotations

import random
import re
from typing import Any

from openreward.environments import Environment, TextBlock, ToolOutput, tool
from pydantic import BaseModel

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
SPLIT_SIZES = {"train": 48, "test": 16}
NAMES = ["Ada", "Bruno", "Clara", "Dmitri", "Elena", "Farid", "Greta", "Hugo"]
ROOMS = ["library", "kitchen", "garden", "cellar", "study", "attic"]
WEAPONS = ["candlestick", "rope", "wrench", "dagger"]


def text(value: str) -> list[TextBlock]:
    """One text block."""
    return [TextBlock(text=value)]


class Answer(BaseModel):
    answer: str


class Accusation(BaseModel):
    name: str


def arithmetic_tasks(split: str) -> list[dict[str, Any]]:
    """Seeded questions: single- and two-digit sums and single-digit products."""
    rng = random.Random(f"openreward/arithmetic/{split}")
    tasks = []
    for i in range(SPLIT_SIZES[split]):
        op = rng.choice("+*")
        a, b = (
            (rng.randint(1, 20), rng.randint(1, 20)) if op == "+" else (rng.randint(2, 9), rng.randint(2, 9))
        )
        tasks.append(
            {"id": f"{split}-{i}", "question": f"{a} {op} {b}", "answer": a + b if op == "+" else a * b}
        )
    return tasks


class Arithmetic(Environment):
    """Answer an arithmetic question by calling ``submit``."""

    @classmethod
    def list_splits(cls) -> list[str]:
        return list(SPLIT_SIZES)

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return arithmetic_tasks(split)

    def get_prompt(self) -> list[TextBlock]:
        question = self.task_spec["question"]
        example = '{"answer": "12"}'
        return text(
            f"What is {question}? Call the submit tool with the number as the answer, like {example}."
        )

    @tool
    async def submit(self, params: Answer) -> ToolOutput:
        """Submit the final answer (a number)."""
        target = float(self.task_spec["answer"])
        numbers = NUMBER.findall(params.answer)
        if not numbers:
            return ToolOutput(blocks=text("No number in the answer."), reward=0.0, finished=True)
        guess = float(numbers[-1])
        if guess == target:
            return ToolOutput(blocks=text("Correct."), reward=1.0, finished=True)
        closeness = max(0.0, 1.0 - abs(guess - target) / max(abs(target), 1.0))
        return ToolOutput(blocks=text("Wrong."), reward=round(0.5 * closeness, 4), finished=True)


def whodunit_tasks(split: str) -> list[dict[str, Any]]:
    """Seeded mysteries: three suspects, one culprit, three clues that each point at the culprit."""
    rng = random.Random(f"openreward/whodunit/{split}")
    tasks = []
    for i in range(SPLIT_SIZES[split]):
        suspects = rng.sample(NAMES, 3)
        culprit = rng.choice(suspects)
        innocent = [s for s in suspects if s != culprit]
        room, weapon = rng.choice(ROOMS), rng.choice(WEAPONS)
        places = rng.sample([r for r in ROOMS if r != room], 2)
        tasks.append(
            {
                "id": f"{split}-{i}",
                "suspects": suspects,
                "culprit": culprit,
                "room": room,
                "alibis": f"{innocent[0]} was in the {places[0]} and {innocent[1]} in the {places[1]}; "
                f"nobody saw {culprit}.",
                "witness": f"A witness heard footsteps going to the {room}, where someone who looked like "
                f"{culprit} closed the door.",
                "evidence": f"The {weapon} found in the {room} carries {culprit}'s fingerprints.",
            }
        )
    return tasks


class WhoDunIt(Environment):
    """Find the culprit: read the clues, then accuse one suspect."""

    CLUE_REWARD = 0.1

    def __init__(self, task_spec: Any = {}, secrets: dict[str, str] = {}) -> None:  # noqa: B006 (the base's signature)
        super().__init__(task_spec, secrets)
        self.seen: set[str] = set()

    @classmethod
    def list_splits(cls) -> list[str]:
        return list(SPLIT_SIZES)

    @classmethod
    def list_tasks(cls, split: str) -> list[dict[str, Any]]:
        return whodunit_tasks(split)

    def get_prompt(self) -> list[TextBlock]:
        spec = self.task_spec
        return text(
            f"A murder in the {spec['room']}. The suspects are {', '.join(spec['suspects'])}. Use the clue "
            "tools (alibis, witness, evidence), then call accuse with the culprit's name."
        )

    def clue(self, name: str) -> ToolOutput:
        """The clue ``name``; its first reading earns a partial reward."""
        first = name not in self.seen
        self.seen.add(name)
        return ToolOutput(blocks=text(self.task_spec[name]), reward=self.CLUE_REWARD if first else 0.0)

    @tool
    async def alibis(self) -> ToolOutput:
        """Where the suspects say they were."""
        return self.clue("alibis")

    @tool
    async def witness(self) -> ToolOutput:
        """What a witness saw."""
        return self.clue("witness")

    @tool
    async def evidence(self) -> ToolOutput:
        """What the weapon shows."""
        return self.clue("evidence")

    @tool
    async def accuse(self, params: Accusation) -> ToolOutput:
        """Accuse one suspect by name; ends the case."""
        right = params.name.strip().lower() == self.task_spec["culprit"].lower()
        verdict = "Correct: case closed." if right else f"Wrong: it was {self.task_spec['culprit']}."
        return ToolOutput(blocks=text(verdict), reward=1.0 if right else 0.0, finished=True)


ENVIRONMENTS: list[type[Environment]] = [Arithmetic, WhoDunIt]
