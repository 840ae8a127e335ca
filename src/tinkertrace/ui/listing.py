"""The rollout list's query: filters, text search, sort and page from the URL, as SQL over the index's
``rollouts`` table (one row per rollout), and the page of rows it gives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tinkertrace import semconv as sc
from tinkertrace.ui import outcomes

PAGE_SIZES = (25, 50, 100, 200)
STATUSES = (sc.STATUS_SUCCEEDED, sc.STATUS_FAILED, sc.STATUS_TIMED_OUT, "unknown")


# Columns a list can be sorted by (the table's header links), and the default: newest first.
SORTABLE = (
    "start_ms", "rollout_id", "task_id", "agents", "status", "reward", "turns", "tokens",
    "policy_version", "duration_s", "trained_step", "outcome",
)  # fmt: skip
LIST_COLUMNS = (
    "rollout_id", "task_id", "agents", "status", "reward", "turns", "tokens", "policy_version",
    "start_ms", "duration_s", "trained_step", "incomplete", "split", "attempt", "outcome", "times_trained",
    "drop_reason", "drop_step", "versions_behind",
)  # fmt: skip


@dataclass(frozen=True)
class RolloutQuery:
    """One page of the rollout list: filters, text search, sort and page (all from the URL)."""

    sort: str = "start_ms"
    desc: bool = True
    page: int = 1
    per_page: int = 50
    status: str | None = None
    split: str | None = None
    task: str | None = None
    agent: str | None = None
    text: str | None = None
    incomplete: bool | None = None
    trained: bool | None = None
    outcome: str | None = None
    version: int | None = None  # policy version

    def __post_init__(self) -> None:
        if self.sort not in SORTABLE:
            raise ValueError(f"cannot sort by {self.sort!r}; choose one of {', '.join(SORTABLE)}")
        if self.per_page not in PAGE_SIZES:
            raise ValueError(f"page size must be one of {PAGE_SIZES}, got {self.per_page}")
        if self.page < 1:
            raise ValueError(f"page must be 1 or more, got {self.page}")
        if self.status is not None and self.status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {self.status!r}")
        if self.outcome is not None and self.outcome not in outcomes.OUTCOMES:
            raise ValueError(f"outcome must be one of {', '.join(outcomes.OUTCOMES)}, got {self.outcome!r}")

    def where(self) -> tuple[str, list[Any]]:
        """SQL condition and its parameters."""
        terms: list[str] = ["true"]
        params: list[Any] = []
        for column, value in (("status", self.status), ("split", self.split), ("task_id", self.task)):
            if value:
                terms.append(f"{column} = ?")
                params.append(value)
        if self.agent:
            terms.append("contains(lower(agents), lower(?))")
            params.append(self.agent)
        if self.text:
            terms.append("contains(haystack, lower(?))")
            params.append(self.text.strip())
        if self.incomplete is not None:
            terms.append("incomplete IS NOT NULL" if self.incomplete else "incomplete IS NULL")
        if self.trained is not None:
            terms.append("outcome = 'trained'" if self.trained else "outcome <> 'trained'")
        if self.version is not None:
            terms.append("policy_version = ?")
            params.append(self.version)
        if self.outcome == "dropped":
            terms.append(outcomes.IS_DROPPED)
        elif self.outcome is not None:
            terms.append("outcome = ?")
            params.append(self.outcome)
        return " AND ".join(terms), params

    def select(self) -> tuple[str, list[Any]]:
        """SQL of every matching row (the list's columns, in the list's order) and its parameters."""
        where, params = self.where()
        order = "DESC" if self.desc else "ASC"
        sql = (
            f"SELECT {', '.join(LIST_COLUMNS)} FROM rollouts WHERE {where} "
            f"ORDER BY {self.sort} {order} NULLS LAST, rollout_id"
        )
        return sql, params


@dataclass
class RolloutPage:
    rows: list[dict[str, Any]]
    total: int  # rows matching the filters
    query: RolloutQuery

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.query.per_page))
