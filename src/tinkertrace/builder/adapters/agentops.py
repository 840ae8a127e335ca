"""AgentOps' reward form (as Agent-lightning uses it): an attribute ``agentops.task.output`` or
``agentops.entity.output`` holding JSON ``{"type": "reward", "value": x}``; agent spans carry
``agent.name``."""

from __future__ import annotations

from tinkertrace import semconv as sc
from tinkertrace.builder.adapters.base import Adapter
from tinkertrace.spanstore.sql import attr

OUTPUT_KEYS = ("agentops.task.output", "agentops.entity.output")


def _reward_value() -> str:
    """SQL: the value of a ``{"type": "reward", "value": x}`` output attribute, else null."""
    parts = []
    for key in OUTPUT_KEYS:
        text = attr(key)
        parts.append(
            f"CASE WHEN json_valid({text}) AND json_extract_string({text}, '$.type') = 'reward' "
            f"THEN TRY_CAST(json_extract_string({text}, '$.value') AS DOUBLE) END"
        )
    return f"COALESCE({', '.join(parts)})"


VALUE = _reward_value()

ADAPTER = Adapter(
    name="agentops",
    # only spans whose attributes mention AgentOps pay for the JSON parsing
    match=f"(contains(attributes, 'agentops.') AND {VALUE} IS NOT NULL)",
    columns={
        "span_type": f"'{sc.TYPE_REWARD}'",
        "reward_name": f"'{sc.PRIMARY_REWARD}'",
        "reward_value": VALUE,
    },
    agent_name=attr(sc.FOREIGN_AGENT_NAME),
)
