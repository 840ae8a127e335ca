"""Reading OpenAI-compatible responses (JSON or a reassembled SSE stream) into one record.

Understands vLLM-style ``prompt_token_ids`` (top level for chat, per choice for completions) and
``choices[].token_ids``, chat logprobs (``logprobs.content[].logprob``) and completion logprobs
(``logprobs.token_logprobs``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import orjson

from tinkertrace import semconv


@dataclass
class ChoiceRecord:
    """One choice, reassembled."""

    index: int
    text: list[str] = field(default_factory=list)
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str | None = None
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    role: str = "assistant"
    policy_version_runs: list[int] | None = None  # semconv.POLICY_VERSION_RUNS of its tokens, when sent

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": self.role, "content": "".join(self.text)}
        if self.tool_calls:
            msg["tool_calls"] = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        if self.finish_reason is not None:
            msg["finish_reason"] = self.finish_reason
        return msg


@dataclass
class ResponseRecord:
    """What the SDK keeps of a response."""

    response_id: str | None = None
    model: str | None = None
    prompt_token_ids: list[int] | None = None
    choices: dict[int, ChoiceRecord] = field(default_factory=dict)
    usage: dict[str, Any] | None = None
    policy_version: int | None = None
    policy_version_runs: list[int] | None = None  # choice 0's, on the envelope

    def version_runs(self) -> list[int] | None:
        """The per-token policy versions (flat runs) of choice 0: its own, else the envelope's."""
        choice = self.choices.get(0)
        runs = choice.policy_version_runs if choice is not None else None
        return runs if runs is not None else self.policy_version_runs

    def choice(self, index: int) -> ChoiceRecord:
        if index not in self.choices:
            self.choices[index] = ChoiceRecord(index)
        return self.choices[index]


def _extend(current: list | None, more: list | None) -> list | None:
    if more is None:
        return current
    if current is None:
        return list(more)
    current.extend(more)
    return current


def _logprobs(logprobs: Any) -> list[float] | None:
    if not isinstance(logprobs, dict):
        return None
    content = logprobs.get("content")
    if isinstance(content, list):
        return [float(item["logprob"]) for item in content]
    token_logprobs = logprobs.get("token_logprobs")
    if isinstance(token_logprobs, list):
        return [float("nan") if lp is None else float(lp) for lp in token_logprobs]
    return None


def payload_version_runs(payload: dict[str, Any]) -> list[int] | None:
    """A wire object's ``policy_version_runs`` (flat [version, count, ...] pairs), when well formed."""
    runs = payload.get(semconv.RESPONSE_POLICY_VERSION_RUNS)
    if not isinstance(runs, list) or len(runs) % 2 or not all(isinstance(v, int) for v in runs):
        return None
    return list(runs)


def _merge_tool_calls(choice: ChoiceRecord, deltas: list[dict[str, Any]], streaming: bool) -> None:
    for pos, delta in enumerate(deltas):
        idx = int(delta.get("index", pos))
        if not streaming or idx not in choice.tool_calls:
            choice.tool_calls[idx] = json.loads(json.dumps(delta))
            choice.tool_calls[idx].pop("index", None)
            continue
        known = choice.tool_calls[idx]
        fn_delta = delta.get("function") or {}
        fn = known.setdefault("function", {})
        for key in ("name", "arguments"):
            if fn_delta.get(key):
                fn[key] = fn.get(key, "") + fn_delta[key] if key == "arguments" else fn_delta[key]
        if delta.get("id"):
            known["id"] = delta["id"]


def apply_payload(record: ResponseRecord, payload: dict[str, Any], streaming: bool) -> None:
    """Fold one JSON response (or one stream chunk) into ``record``."""
    record.response_id = record.response_id or payload.get("id")
    record.model = record.model or payload.get("model")
    if payload.get(semconv.RESPONSE_PROMPT_TOKEN_IDS) is not None:
        record.prompt_token_ids = list(payload[semconv.RESPONSE_PROMPT_TOKEN_IDS])
    if payload.get("usage"):
        record.usage = payload["usage"]
    version = payload.get(semconv.RESPONSE_POLICY_VERSION)
    if version is not None:
        record.policy_version = int(version)
    record.policy_version_runs = payload_version_runs(payload) or record.policy_version_runs
    for raw in payload.get("choices") or []:
        choice = record.choice(int(raw.get("index", 0)))
        if raw.get(semconv.RESPONSE_PROMPT_TOKEN_IDS) is not None and record.prompt_token_ids is None:
            record.prompt_token_ids = list(raw[semconv.RESPONSE_PROMPT_TOKEN_IDS])
        message = raw.get("delta" if streaming else "message")
        if isinstance(message, dict):
            if message.get("content"):
                choice.text.append(message["content"])
            if message.get("role"):
                choice.role = message["role"]
            if message.get("tool_calls"):
                _merge_tool_calls(choice, message["tool_calls"], streaming)
        elif isinstance(raw.get("text"), str):
            choice.text.append(raw["text"])
        choice.token_ids = _extend(choice.token_ids, raw.get(semconv.RESPONSE_CHOICE_TOKEN_IDS))
        choice.logprobs = _extend(choice.logprobs, _logprobs(raw.get("logprobs")))
        if raw.get("finish_reason"):
            choice.finish_reason = raw["finish_reason"]
        choice.policy_version_runs = payload_version_runs(raw) or choice.policy_version_runs


def parse_json(body: bytes) -> ResponseRecord:
    record = ResponseRecord()
    apply_payload(record, orjson.loads(body), streaming=False)
    return record


def parse_sse(body: bytes) -> ResponseRecord:
    """Reassemble an SSE stream of chunks (``data: {...}`` events, ``data: [DONE]`` ignored)."""
    record = ResponseRecord()
    for line in body.splitlines():
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if not data or data == b"[DONE]":
            continue
        apply_payload(record, orjson.loads(data), streaming=True)
    return record
