"""One OpenReward episode played by the policy behind an OpenAI-compatible endpoint: the agent and task
source that an environment with ``openreward:`` set uses in ``tinkertrace train`` (and ``eval``).

Each rollout is one ORS session: the environment's prompt is the first user message, its tools are
offered as chat-completions function tools (the recording endpoint renders and parses them, so every
policy call is a token-exact span), each tool call runs on the server and its text comes back as
the ``tool`` message, and each ``ToolOutput.reward`` is emitted as a reward linked to the policy
call that made the tool call (``response_id``). ``finished`` ends the episode; reaching
``max_turns`` policy calls first ends it with a ``truncated`` reward (so ``nonterminal_reward``
applies). The session is pinged every ``PING_INTERVAL_S`` seconds while the episode is played (a
server reaps sessions unpinged for 900 s, and a policy call may be slower than that). An
:class:`~tinkertrace.ors.client.OrsError` (server gone, a tool that raised, a reaped session) fails
the rollout with its reason.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import tinkertrace
from tinkertrace.ors.client import OrsEnvironment, OrsError, ToolResult
from tinkertrace.ors.upload import spool_rollout

# How often a session is pinged while its episode is played: an ORS server reaps sessions unpinged for
# 900 s (tool calls do not count), and a policy call on a slow machine can take over 10 minutes.
PING_INTERVAL_S = 60.0
MALFORMED = "malformed_tool_call"  # the endpoint's finish_reason for a tool call it could not parse
TRUNCATED = "truncated"


def chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ORS tool specs as chat-completions function tools (no input schema: no arguments)."""
    empty = {"type": "object", "properties": {}}
    return [
        {
            "type": "function",
            "function": {
                "name": spec["name"],
                "description": spec.get("description") or "",
                "parameters": spec.get("input_schema") or empty,
            },
        }
        for spec in tools
    ]


async def _task_specs(openreward: str, split: str) -> list[Any]:
    async with OrsEnvironment(openreward) as env:
        return await env.tasks(split)


def load_tasks(split: str = "train", *, openreward: str) -> list[dict[str, Any]]:
    """The tasks of ``split`` on the server, as ``{"id": "SPLIT-INDEX", "split", "index"}`` (a session
    is created from split and index)."""
    count = len(asyncio.run(_task_specs(openreward, split)))
    return [{"id": f"{split}-{i}", "split": split, "index": i} for i in range(count)]


def _arguments(raw: str | None) -> dict[str, Any] | None:
    try:
        value = json.loads(raw or "{}")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


@dataclass
class Episode:
    """One ORS episode: where it is played, the policy's request settings, the turn limit, and (filled
    as it is played) its chat transcript with the reward of each rewarded tool message by index."""

    openreward: str
    request: dict[str, Any]  # chat.completions settings: model, temperature, max_tokens, tool_choice
    max_turns: int
    messages: list[dict[str, Any]] = field(default_factory=list)
    rewarded: dict[int, float] = field(default_factory=dict)

    async def play(self, task: dict[str, Any], policy: Any) -> dict[str, Any]:
        """Play ``task`` with ``policy`` (an ``AsyncOpenAI`` client); the summed reward and how it ended."""
        async with OrsEnvironment(self.openreward) as env:
            tools = chat_tools(await env.tools())
            names = ", ".join(t["function"]["name"] for t in tools)
            async with (
                env.session(task["split"], int(task["index"])) as opened,
                opened.kept_alive(PING_INTERVAL_S) as session,
            ):
                self.messages.append({"role": "user", "content": await session.prompt()})
                completion = None
                for turn in range(self.max_turns):
                    completion = await policy.chat.completions.create(
                        messages=self.messages, tools=tools, **self.request
                    )
                    choice = completion.choices[0]
                    self.messages.append(choice.message.model_dump(exclude_none=True))
                    if not choice.message.tool_calls:
                        problem = (
                            "could not be parsed" if choice.finish_reason == MALFORMED else "was missing"
                        )
                        error = f"Error: the tool call {problem}. Call one of: {names}."
                        self.messages.append({"role": "user", "content": error})
                        continue
                    for call in choice.message.tool_calls:
                        result = await _run_call(session, call)
                        if result.reward is not None:
                            self.rewarded[len(self.messages)] = result.reward
                            tinkertrace.emit_reward(result.reward, response_id=completion.id)
                        self.messages.append(
                            {"role": "tool", "tool_call_id": call.id, "content": result.text}
                        )
                        if result.finished:
                            return self.outcome(finished=True, turns=turn + 1)
        if not self.rewarded and completion is not None:  # an episode that earned nothing earns 0
            tinkertrace.emit_reward(0.0, response_id=completion.id)
        tinkertrace.emit_reward(1.0, name=TRUNCATED)
        return self.outcome(finished=False, turns=self.max_turns)

    def outcome(self, *, finished: bool, turns: int) -> dict[str, Any]:
        """The agent's return value: summed reward, whether it finished, turns, the rewards in order."""
        rewards = list(self.rewarded.values())
        return {"reward": sum(rewards), "finished": finished, "turns": turns, "rewards": rewards}


@tinkertrace.traced_rollout
async def run_episode(
    task: dict[str, Any],
    *,
    base_url: str,
    model: str,
    openreward: str,
    temperature: float = 1.0,
    max_tokens: int | None = None,
    max_turns: int = 8,
    tool_choice: str | None = None,
    api_key: str = "EMPTY",
    upload_run: str | None = None,
    upload_spool: str | None = None,
) -> dict[str, Any]:
    """Play task ``task["index"]`` of split ``task["split"]`` of the ORS environment ``openreward``
    with at most ``max_turns`` policy calls; returns the summed reward and how the episode ended.
    With ``upload_run`` and ``upload_spool``, the finished episode's transcript is spooled for upload."""
    from openai import AsyncOpenAI

    request: dict[str, Any] = {"model": model, "temperature": temperature}
    request |= {"max_tokens": max_tokens} if max_tokens is not None else {}
    if tool_choice is not None:  # auto, none, required, or a tool's name (that tool is called)
        named = {"type": "function", "function": {"name": tool_choice}}
        request["tool_choice"] = tool_choice if tool_choice in ("auto", "none", "required") else named
    episode = Episode(openreward, request, max_turns)
    policy = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=2)
    try:
        result = await episode.play(task, policy)
    finally:
        await policy.close()
    if upload_run and upload_spool:
        transcript = {
            "messages": episode.messages,
            "rewards": episode.rewarded,
            "finished": result["finished"],
        }
        spool_rollout(upload_spool, upload_run, openreward, task, transcript)
    return result


async def _run_call(session: Any, call: Any) -> ToolResult:
    """Run one structured tool call on the server; arguments that are not a JSON object are answered
    locally, as the server answers a bad input, and a refused call (episode over) ends the rollout."""
    arguments = _arguments(call.function.arguments)
    if arguments is None:
        return ToolResult("Error: the arguments are not a JSON object.", error="input_validation")
    result: ToolResult = await session.call(call.function.name, arguments)
    if result.error == "episode_finished":
        raise OrsError(
            f"the server refused {call.function.name!r}: the episode had already finished", "refused"
        )
    return result
