"""What an adapter is: everything one producer of spans decides, as SQL over its rows."""

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
    """How one producer's spans map onto our columns. Every field but ``name`` and ``match`` is
    optional: the builder's views coalesce ours with each adapter's, in :data:`ADAPTERS` order.

    Row level (over a raw span row, its JSON text columns ``attributes`` and ``resource_attributes``
    included; evaluated only for the rows this adapter matched):

    - ``match``: SQL predicate that holds for the spans this producer wrote (their ``span_type`` is null);
    - ``columns``: column name (of :data:`MAPPABLE_COLUMNS`) → SQL expression;
    - ``dimensions``: SQL, ``MAP(VARCHAR, DOUBLE)`` of a reward span's named values (also evaluated
      for the rows of this producer's processes: ``rollout_id`` below);
    - ``conversation``: the call's chat messages from its attributes (a dict of the JSON ``attributes``
      column), or None when they were not recorded, for re-tokenising a call without token ids.

    Process level (over any row not ours: what the producer writes once per process, e.g. in its
    resource attributes, or on spans no adapter maps):

    - ``rollout_id``, ``attempt``: SQL, the rollout id and attempt (INTEGER) the span's process names;
    - ``completeness_record``: whether those rollouts carry a root span with the counts a rollout's
      completeness is checked against (without one they are complete);
    - ``agent_name``: SQL, the agent name of a span without a span type that is an agent span, else null.

    Any LLM span (a producer's attribute convention may appear on another's spans: OpenLLMetry's
    instrumentation under Agent-lightning): ``finish_reasons``, SQL expressions each giving a finish
    reason as text (a span is ``truncated`` when one is a token-limit reason).
    """

    name: str
    match: str
    columns: Mapping[str, str] = field(default_factory=dict)
    finish_reasons: tuple[str, ...] = ()
    dimensions: str | None = None
    conversation: Callable[[dict[str, Any]], Conversation | None] | None = None
    rollout_id: str | None = None
    attempt: str | None = None
    completeness_record: bool = False
    agent_name: str | None = None

    def __post_init__(self) -> None:
        unknown = set(self.columns) - set(MAPPABLE_COLUMNS)
        if unknown:
            raise ValueError(f"adapter {self.name!r} maps unknown columns {sorted(unknown)}")
