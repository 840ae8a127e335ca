"""twenty_questions as a CrewAI flow: the player is a CrewAI ``Agent`` that plays with two tools.

The player asks yes/no questions with the ``ask`` tool and ends the game with the ``guess`` tool; both
are structured tool calls (OpenAI function calling through CrewAI's native OpenAI provider, against any
OpenAI-compatible endpoint), never parsed from text. A ``Flow`` holds the game: its ``play`` step runs
the player, its ``score`` step rewards it. The only tinkertrace lines are ``@traced_rollout`` on
:func:`play` and ``emit_reward``: CrewAI's chat completions go through ``httpx``, where the SDK's
capture adds token ids and logprobs to each call and records it.

The answerer is a rule by default (``answerer="rule"``: "Yes." when the question names the secret
noun, else "No."), so every model call is the player's; ``answerer="model"`` asks the served model
instead, as the plain-OpenAI version (``agent.py``) does, under the agent name ``answerer``.
``show_candidates`` lists the category's nouns in the task: the short form a small model can learn.

Runs in its own environment (``make crewai-env``, .venv-crewai): see README.md.
"""

from __future__ import annotations

import logging
import os

# CrewAI's own telemetry and trace upload would reach the internet (and its first-run trace prompt waits
# for a keypress); neither is part of the agent.
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_DISABLE_TRACKING", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

from typing import Any

from crewai import LLM, Agent
from crewai.events.event_listener import event_listener
from crewai.flow.flow import Flow, listen, start
from crewai.llms.providers.openai.completion import OpenAICompletion
from crewai.tools import BaseTool
from crewai.tools.tool_failure import ToolExecutionFailedError
from pydantic import BaseModel, Field, PrivateAttr

import tinkertrace
from examples.twenty_questions.agent import ANSWERER_SYSTEM, WORD, nouns, parse_answer, score
from examples.twenty_questions.agent import load_tasks as load_tasks  # the task source, shared

# CrewAI's console panels for an agent run on its own (Agent.kickoff) print whatever the agent's
# verbose; a Crew turns them off the same way when it is not verbose.
event_listener.formatter.verbose = False
# CrewAI warns on every call to a model it has no token counter for that it estimates the prompt's length
# (for its context-window bookkeeping); the endpoint reports the real counts.
logging.getLogger("crewai.llms.base_llm").setLevel(logging.ERROR)

ROLE = "twenty questions player"
GOAL = "Find the secret {category} with as few yes/no questions as possible, then guess it."
BACKSTORY = "You are playing twenty questions. You only learn about the secret through your tools."
TASK = (
    "I am thinking of a {category}.{candidates} Ask yes/no questions with the ask tool, at most "
    "{max_questions}. When you know it, call the guess tool with the noun. For example:\n"
    '<tool_call>{{"name": "ask", "arguments": {{"question": "Is it a cup?"}}}}</tool_call>'
)


class GameState(BaseModel):
    """One game: the secret, what was asked and answered, and the outcome."""

    category: str = ""
    answer: str = ""
    questions: list[str] = Field(default_factory=list)
    answers: list[str] = Field(default_factory=list)
    guess: str | None = None
    reward: float = 0.0


class QuestionArgs(BaseModel):
    question: str = Field(description="a yes/no question about the secret, e.g. 'Is it a cat?'")


class GuessArgs(BaseModel):
    noun: str = Field(description="the secret noun, one word")


class AskTool(BaseTool):
    """The ``ask`` tool: the answerer's yes/no reply to one question."""

    name: str = "ask"
    description: str = (
        "Ask one yes/no question about the secret noun; the reply is 'Yes.' or 'No.'. "
        "Naming the secret ends the game."
    )
    args_schema: type[BaseModel] = QuestionArgs
    _game: GameState = PrivateAttr()
    _answerer: LLM | None = PrivateAttr(default=None)
    _limit: int = PrivateAttr(default=4)

    def bind(self, game: GameState, answerer: LLM | None, limit: int) -> AskTool:
        self._game, self._answerer, self._limit = game, answerer, limit
        return self

    def _run(self, question: str) -> str:
        game = self._game
        game.questions.append(question)
        if game.answer in WORD.findall(question.lower()):
            self.result_as_answer = True  # named: the game ends (CrewAI reads this after the call)
            reply = f"Yes! It is {game.answer}."
        elif self._answerer is None:
            reply = "No."
        else:
            with tinkertrace.agent_span("answerer"):
                system = ANSWERER_SYSTEM.format(category=game.category, answer=game.answer)
                reply = parse_answer(
                    str(
                        self._answerer.call(
                            [{"role": "system", "content": system}, {"role": "user", "content": question}]
                        )
                    )
                )
        game.answers.append(reply)
        if not self.result_as_answer and len(game.questions) >= self._limit:
            self.result_as_answer = True  # the last question: the game ends
            reply += " That was your last question."
        return reply


class GuessTool(BaseTool):
    """The ``guess`` tool: names the secret and ends the game (its result is the agent's answer)."""

    name: str = "guess"
    description: str = "Guess the secret noun. This ends the game."
    args_schema: type[BaseModel] = GuessArgs
    result_as_answer: bool = True
    _game: GameState = PrivateAttr()

    def bind(self, game: GameState) -> GuessTool:
        self._game = game
        return self

    def _run(self, noun: str) -> str:
        self._game.guess = noun
        right = self._game.answer in WORD.findall(noun.lower())
        return "Correct!" if right else f"Wrong, it was {self._game.answer}."


class PlayerLLM(OpenAICompletion):
    """CrewAI's native OpenAI provider, sending ``tool_choice`` as set (CrewAI always sends ``auto``):
    ``auto``, ``required`` or a tool's name. A named tool makes every player turn a call of it: the
    endpoint opens the reply with the call's start, up to its arguments, which a small model that never
    calls tools on its own (SmolLM2-135M) then completes."""

    tool_choice: str = "auto"

    def _prepare_completion_params(self, messages: Any, tools: Any = None) -> dict[str, Any]:
        params = super()._prepare_completion_params(messages, tools)
        if tools and self.tool_choice in ("auto", "required", "none"):
            params["tool_choice"] = self.tool_choice
        elif tools:
            params["tool_choice"] = {"type": "function", "function": {"name": self.tool_choice}}
        return params


class TwentyQuestions(Flow[GameState]):
    """The game as a CrewAI flow: ``play`` runs the player agent, ``score`` rewards it."""

    # A flow creates a LanceDB-backed memory store unless told not to (CrewAI's own internal flows set
    # this flag); the game remembers nothing across games, and lancedb is not installed (requirements.txt).
    _skip_auto_memory = True

    def __init__(self, player_llm: LLM, answerer_llm: LLM | None, max_questions: int, show_candidates: bool):
        super().__init__(suppress_flow_events=True)  # no console panels per step
        self.player_llm, self.answerer_llm = player_llm, answerer_llm
        self.max_questions, self.show_candidates = max_questions, show_candidates

    @start()
    def play(self) -> str:
        game = self.state
        player = Agent(
            role=ROLE,
            goal=GOAL.format(category=game.category),
            backstory=BACKSTORY,
            llm=self.player_llm,
            tools=[AskTool().bind(game, self.answerer_llm, self.max_questions), GuessTool().bind(game)],
            max_iter=self.max_questions + 1,
            verbose=False,
        )
        listed = ", ".join(nouns(game.category))
        candidates = f" It is one of: {listed}." if self.show_candidates else ""
        prompt = TASK.format(category=game.category, candidates=candidates, max_questions=self.max_questions)
        return str(player.kickoff(prompt).raw)

    @listen(play)
    def score(self, _final: str | None) -> float:
        game = self.state
        asked = game.questions + ([f"Is it a {game.guess}?"] if game.guess is not None else [])
        found = any(game.answer in WORD.findall(q.lower()) for q in asked)
        listed = nouns(game.category) if self.show_candidates else ()
        game.reward = score(asked, game.answer, found, listed)
        return game.reward


@tinkertrace.traced_rollout
def play(
    task: dict,
    *,
    base_url: str,
    model: str,
    api_key: str = "EMPTY",
    temperature: float = 1.0,
    max_tokens: int = 40,
    max_questions: int = 4,
    show_candidates: bool = True,
    answerer: str = "rule",
    tool_choice: str = "ask",
) -> dict[str, Any]:
    """Play one game of ``task`` (category, answer) against the endpoint at ``base_url``. The defaults are
    the short form SmolLM2-135M is trained on; a model that calls tools on its own plays the full game
    with ``tool_choice="auto"``, ``show_candidates=False`` and ``answerer="model"``."""
    if answerer not in ("rule", "model"):
        raise ValueError(f"answerer must be 'rule' or 'model', not {answerer!r}")
    endpoint = {"base_url": base_url, "api_key": api_key, "custom_openai": True}
    player_llm = PlayerLLM(
        model=model, temperature=temperature, max_tokens=max_tokens, tool_choice=tool_choice, **endpoint
    )
    answerer_llm = (
        LLM(model=model, temperature=0.0, max_tokens=4, **endpoint) if answerer == "model" else None
    )
    flow = TwentyQuestions(player_llm, answerer_llm, max_questions, show_candidates)
    with tinkertrace.agent_span("player"):
        try:
            flow.kickoff(inputs={"category": task["category"], "answer": task["answer"]})
        except ToolExecutionFailedError:  # CrewAI stops a player repeating the same call: the game is over
            flow.score(None)
        game = flow.state
        tinkertrace.emit_reward(game.reward)
    found = game.reward == 1.0
    return {"reward": game.reward, "found": found, "questions": len(game.questions), "guess": game.guess}
