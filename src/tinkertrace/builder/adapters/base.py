"""What an adapter is, and the SQL helpers adapters share."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

MAPPABLE_COLUMNS = (
    "span_type", "model", "response_id", "prompt_token_ids", "response_token_ids", "response_logprobs",
    "token_source", "reward_name", "reward_value",
)  # fmt: skip
"""Columns of the ``spans`` table an adapter may fill (ours win where the row has them)."""


@dataclass(frozen=True)
class Conversation:
    """One LLM call as chat messages (OpenAI chat form): what the model saw and what it answered."""

    messages: list[dict[str, Any]]
    output: dict[str, Any]  # the assistant message: role, content, optional tool_calls
    tools: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class Adapter:
    """How one producer's spans map onto our columns.

    ``match``: SQL predicate over a raw span row (its ``span_type`` is null) that holds for the spans
    this producer wrote and this adapter maps; ``columns``: column name (of
    :data:`MAPPABLE_COLUMNS`) → SQL expression over the same row; ``conversation``: the call's chat
    messages from its attributes (a dict of the JSON ``attributes`` column), or None when they were
    not recorded, for re-tokenising a call that carries no token ids.
    """

    name: str
    match: str
    columns: Mapping[str, str] = field(default_factory=dict)
    conversation: Callable[[dict[str, Any]], Conversation | None] | None = None

    def __post_init__(self) -> None:
        unknown = set(self.columns) - set(MAPPABLE_COLUMNS)
        if unknown:
            raise ValueError(f"adapter {self.name!r} maps unknown columns {sorted(unknown)}")
