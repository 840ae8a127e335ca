"""One adapter per producer of spans: everything that producer decides, as SQL over its rows.

Our SDK writes the columns directly (``span_type`` set: nothing to map). Every other producer is a
module here exporting ``ADAPTER`` (:class:`~tinkertrace.builder.adapters.base.Adapter`): a SQL
predicate that recognises its spans among the rows without our ``span_type``, one SQL expression per
column it fills, and its process-level values (rollout id, attempt, agent name), reward dimensions,
finish reasons and whether its rollouts carry a completeness record. The builder's views are ours,
coalesced over the adapters by the functions below (they name no producer): the first adapter in
:data:`ADAPTERS` order whose ``match`` holds maps a row (column ``producer`` names it), so only
foreign rows ever pay for the JSON work. A new producer is one new module listed here
(docs/builder.md, "Adding a producer").

Producers that store only text (GenAI semconv, OpenLLMetry, Logfire) leave the token columns empty;
``conversation`` turns their attributes into chat messages that
:mod:`tinkertrace.builder.retokenize` renders with the served model's tokenizer at build time.
"""

from __future__ import annotations

from typing import Literal

from tinkertrace.builder.adapters import agentlightning, agentops, genai, logfire, openinference
from tinkertrace.builder.adapters.base import Adapter, Conversation

ADAPTERS: tuple[Adapter, ...] = (
    agentlightning.ADAPTER,
    agentops.ADAPTER,
    openinference.ADAPTER,
    logfire.ADAPTER,
    genai.ADAPTER,
)
"""Tried in this order: the first adapter whose ``match`` holds maps a row."""

OURS = "tinkertrace"  # the producer column of spans our SDK (or endpoint) wrote

__all__ = ["ADAPTERS", "OURS", "Adapter", "Conversation", "by_name"]

ProcessField = Literal["rollout_id", "attempt", "agent_name"]
"""The adapters' process-level fields (read on any row not ours)."""


def by_name(name: str) -> Adapter:
    """The adapter called ``name`` (KeyError naming the known ones otherwise)."""
    for adapter in ADAPTERS:
        if adapter.name == name:
            return adapter
    raise KeyError(f"no span adapter {name!r}; known: {', '.join(a.name for a in ADAPTERS)}")


def producer_sql() -> str:
    """SQL over a raw row: who wrote it (:data:`OURS` when it has our span type, else the first adapter
    whose ``match`` holds, else null)."""
    whens = " ".join(f"WHEN {a.match} THEN '{a.name}'" for a in ADAPTERS)
    return f"CASE WHEN span_type IS NOT NULL THEN '{OURS}' {whens} END"


def column_sql(column: str, producer: str = "producer") -> str | None:
    """SQL: the adapters' expression for ``column``, each for its own rows (``producer`` names the
    row's adapter); None when no adapter maps the column."""
    branches = " ".join(f"WHEN '{a.name}' THEN {a.columns[column]}" for a in ADAPTERS if column in a.columns)
    return f"CASE {producer} {branches} END" if branches else None


def dimensions_sql(producer: str = "producer", process: str = "process_producer") -> str | None:
    """SQL: the adapters' reward dimensions, each for the rows it wrote (column ``producer``) or whose
    process it is (column ``process``); None when no adapter reads dimensions."""
    whens = " ".join(
        f"WHEN {producer} = '{a.name}' OR {process} = '{a.name}' THEN {a.dimensions}"
        for a in ADAPTERS
        if a.dimensions is not None
    )
    return f"CASE {whens} END" if whens else None


def finish_reasons() -> tuple[str, ...]:
    """Every adapter's finish-reason expressions, each once (they are read on any LLM span)."""
    return tuple(dict.fromkeys(e for a in ADAPTERS for e in a.finish_reasons))


def process_sql(field: ProcessField) -> str:
    """SQL: the first non-null of the adapters' process-level ``field`` expressions (``NULL`` when no
    adapter declares one), for a row that is not ours."""
    exprs = list(dict.fromkeys(e for a in ADAPTERS if (e := getattr(a, field)) is not None))
    return f"COALESCE({', '.join(exprs)})" if len(exprs) > 1 else (exprs[0] if exprs else "NULL")


def process_producer_sql() -> str:
    """SQL: the adapter whose process-level rollout id a row not ours carries, else null."""
    whens = " ".join(f"WHEN ({a.rollout_id}) IS NOT NULL THEN '{a.name}'" for a in ADAPTERS if a.rollout_id)
    return f"CASE {whens} END" if whens else "NULL::VARCHAR"


def unchecked_producers() -> tuple[str, ...]:
    """Adapters whose rollouts (process-level ids) carry no completeness record: always complete."""
    return tuple(a.name for a in ADAPTERS if a.rollout_id is not None and not a.completeness_record)
