"""One rollout's spans as the rollout page shows them: a tree on a timeline, the LLM calls' messages,
and which call each reward landed on."""

from __future__ import annotations

import json
from typing import Any

from tinkertrace import semconv as sc
from tinkertrace.ui.built import BuiltRollout

TOOL_OPERATION = "execute_tool"  # the GenAI convention's tool span (gen_ai.operation.name)


def _kind(span: dict[str, Any]) -> str:
    if span["span_type"]:
        return str(span["span_type"])
    name = str(span["name"] or "")
    return "tool" if name.startswith(TOOL_OPERATION) or "tool" in name.lower() else "other"


def span_tree(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Spans in depth-first order with their depth and their bar on the rollout's time axis (percent)."""
    if not spans:
        return []
    t0 = min(s["start_us"] for s in spans)
    t1 = max(s["end_us"] for s in spans)
    width = max(t1 - t0, 1)
    ids = {s["span_id"] for s in spans}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for s in spans:  # already by start time
        parent = s["parent_span_id"] if s["parent_span_id"] in ids else None
        children.setdefault(parent, []).append(s)
    out: list[dict[str, Any]] = []

    def walk(parent: str | None, depth: int) -> None:
        for s in children.get(parent, []):
            out.append(
                {
                    **s,
                    "kind": _kind(s),
                    "depth": depth,
                    "left": round(100 * (s["start_us"] - t0) / width, 3),
                    "width": round(max(100 * (s["end_us"] - s["start_us"]) / width, 0.3), 3),
                    "offset_ms": (s["start_us"] - t0) / 1000,
                    "duration_ms": (s["end_us"] - s["start_us"]) / 1000,
                }
            )
            walk(s["span_id"], depth + 1)

    walk(None, 0)
    return out


def _text(content: Any) -> str:
    """A message's content as text: a string, or the text of its parts (GenAI and OpenAI forms)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            _text(p.get("text") or p.get("content")) if isinstance(p, dict) else str(p) for p in content
        )
    return json.dumps(content)


def _messages(raw: Any) -> list[dict[str, str]]:
    """Messages of a ``gen_ai.*.messages`` attribute (JSON text): role, text, tool calls as JSON."""
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return [{"role": "?", "text": str(raw), "tools": ""}]
    if not isinstance(value, list):
        return []
    out = []
    for m in value:
        if not isinstance(m, dict):
            continue
        parts = m.get("parts")
        text = _text(parts if parts is not None else m.get("content"))
        calls = m.get("tool_calls") or [
            p for p in parts or [] if isinstance(p, dict) and p.get("type") == "tool_call"
        ]
        out.append(
            {"role": str(m.get("role", "?")), "text": text, "tools": json.dumps(calls) if calls else ""}
        )
    return out


def messages_of(spans: list[dict[str, Any]], details: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """span_id -> {"input": [...], "output": [...]} for the LLM spans whose messages were captured."""
    out = {}
    for s in spans:
        if s["span_type"] != sc.TYPE_LLM or s["span_id"] not in details:
            continue
        try:
            attributes = json.loads(details[s["span_id"]]["attributes"] or "{}")
        except ValueError:
            continue
        out[s["span_id"]] = {
            "input": _messages(attributes.get(sc.GENAI_INPUT_MESSAGES)),
            "output": _messages(attributes.get(sc.GENAI_OUTPUT_MESSAGES)),
        }
    return out


def reward_landings(spans: list[dict[str, Any]], built: BuiltRollout) -> list[dict[str, Any]]:
    """Each reward span with where it landed under the build's policy: the builder gives each call
    the sum of its rewards; a reward is matched to the call whose reward it explains (one call; or
    every call under ``final``), unmatched when the builder says so."""
    calls = {t["span_id"]: t for t in built.triplets}
    rewarded = [t for t in built.triplets if t["reward"] is not None]
    out = []
    for s in spans:
        if s["span_type"] != sc.TYPE_REWARD:
            continue
        value = s["reward_value"]
        turns: list[Any]
        if built.incomplete:
            landed, turns = "not built: the rollout is incomplete", []
        elif s["span_id"] in built.unmatched_reward_spans:
            landed, turns = "unmatched: no call took it", []
        elif built.policy == "final":
            same = [t["turn"] for t in rewarded if t["reward"] == value]
            landed = "every call (the rollout's final reward)" if len(same) == len(calls) else "superseded"
            turns = same if len(same) == len(calls) else []
        else:
            same = [t["turn"] for t in rewarded if t["reward"] == value]
            if len(same) == 1:
                landed, turns = f"call {same[0]}", same
            elif same:
                landed, turns = "one of calls " + ", ".join(map(str, same)) + " (equal rewards)", same
            else:
                landed, turns = "a call with other rewards (summed)", []
        out.append({**s, "landed": landed, "turns": turns})
    return out
