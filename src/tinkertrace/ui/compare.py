"""Two rollouts side by side (two attempts at one task, say): their calls turn by turn as the builder
built them, with the turns where they part marked.

Turn ``t`` of each rollout is its ``t``-th LLM call (per agent, as the builder numbers turns). The
two are the same at a turn when the call's prompt and response token ids are equal; the first turn
where they differ is where the attempts diverged (the prompt: what came before differed, e.g. a tool
result; the response: the model sampled something else)."""

from __future__ import annotations

from typing import Any

from tinkertrace.ui.built import BuiltRollout


def _calls(built: BuiltRollout) -> dict[tuple[Any, int], dict[str, Any]]:
    return {(t["agent_name"], int(t["turn"])): t for t in built.triplets}


def _parting(x: Any, y: Any) -> int | None:
    """The first position where token lists ``x`` and ``y`` differ (the shorter one's length when one
    is a prefix of the other), None when they are equal."""
    x, y = list(x), list(y)
    if x == y:
        return None
    return next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))


def turn_pairs(a: BuiltRollout, b: BuiltRollout) -> list[dict[str, Any]]:
    """One row per (agent, turn) of either rollout: both calls (or None), whether prompt and response
    ids agree, and ``first_divergence`` on the first (agent, turn) where they do not."""
    calls_a, calls_b = _calls(a), _calls(b)
    rows, diverged = [], set()
    for key in sorted(set(calls_a) | set(calls_b), key=lambda k: (str(k[0]), k[1])):
        ca, cb = calls_a.get(key), calls_b.get(key)
        same_prompt = bool(ca and cb and list(ca["prompt_token_ids"]) == list(cb["prompt_token_ids"]))
        same_response = bool(ca and cb and list(ca["response_token_ids"]) == list(cb["response_token_ids"]))
        first = not (same_prompt and same_response) and key[0] not in diverged
        if first:
            diverged.add(key[0])
        part = "same" if same_prompt and same_response else "prompt" if not same_prompt else "response"
        at = None
        if ca and cb and part != "same":
            at = _parting(ca[f"{part}_token_ids"], cb[f"{part}_token_ids"])
        rows.append(
            {"agent": key[0], "turn": key[1], "a": ca, "b": cb, "differs": part, "at": at,
             "first_divergence": first}
        )  # fmt: skip
    return rows
