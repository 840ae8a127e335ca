"""One adapter per producer of spans: how its attributes map onto the ``spans`` table's columns.

Our SDK writes the columns directly (``span_type`` set: nothing to map). Every other producer is a
module here exporting ``ADAPTER``: a SQL predicate that recognises its spans among the rows without
our ``span_type``, and one SQL expression per column it fills, over a raw span row (the JSON text
columns ``attributes`` and ``resource_attributes`` included). The builder's ``spans`` view tries the
adapters in :data:`ADAPTERS` order; the first whose ``match`` holds maps the row (column ``producer``
names it), so only foreign rows ever pay for the JSON work. A new producer is one new module listed
here.

Producers that store only text (GenAI semconv, OpenLLMetry, Logfire) leave the token columns empty;
``conversation`` turns their attributes into chat messages that
:mod:`tinkertrace.builder.retokenize` renders with the served model's tokenizer at build time.
"""

from __future__ import annotations

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


def by_name(name: str) -> Adapter:
    """The adapter called ``name`` (KeyError naming the known ones otherwise)."""
    for adapter in ADAPTERS:
        if adapter.name == name:
            return adapter
    raise KeyError(f"no span adapter {name!r}; known: {', '.join(a.name for a in ADAPTERS)}")
