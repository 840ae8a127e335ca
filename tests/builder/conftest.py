"""Helpers for builder tests: span rows in the ``schemas.spans()`` layout, written as Parquet."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tinkertrace import schemas
from tinkertrace import semconv as sc

T0 = 1_700_000_000_000_000_000  # ns


@dataclass
class SpanRows:
    """Accumulates span rows; times are in ms after T0, ids are generated."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    _next: int = 1

    def _id(self) -> str:
        self._next += 1
        return f"{self._next:016x}"

    def span(
        self,
        *,
        trace: str,
        name: str,
        start: float,
        end: float,
        parent: str | None = None,
        span_type: str | None = None,
        attributes: dict[str, Any] | None = None,
        resource: dict[str, Any] | None = None,
        span_id: str | None = None,
        **cols: Any,
    ) -> str:
        sid = span_id or self._id()
        row = {f.name: None for f in schemas.spans()}
        row.update(
            trace_id=trace.rjust(32, "0"),
            span_id=sid,
            parent_span_id=parent,
            name=name,
            kind="INTERNAL",
            start_time=T0 + int(start * 1e6),
            end_time=T0 + int(end * 1e6),
            status_code="UNSET",
            span_type=span_type,
            attributes=json.dumps(attributes or {}),
            resource_attributes=json.dumps(resource or {}),
            events="[]",
            links="[]",
            received_at=T0 + int(end * 1e6) + 1,
        )
        row.update(cols)
        self.rows.append(row)
        return sid

    def rollout(
        self,
        rollout_id: str,
        *,
        start: float = 0,
        end: float = 100,
        task: str = "t1",
        llm_calls: int | None = None,
        rewards: int | None = None,
        split: str = "train",
        attempt: int = 0,
    ) -> str:
        attrs: dict[str, Any] = {sc.ROLLOUT_STATUS: sc.STATUS_SUCCEEDED}
        if llm_calls is not None:
            attrs[sc.ROLLOUT_LLM_CALLS] = llm_calls
        if rewards is not None:
            attrs[sc.ROLLOUT_REWARDS] = rewards
        return self.span(
            trace=rollout_id,
            name=f"rollout {rollout_id}",
            start=start,
            end=end,
            span_type=sc.TYPE_ROLLOUT,
            attributes=attrs,
            rollout_id=rollout_id,
            task_id=task,
            split=split,
            attempt=attempt,
        )

    def llm(
        self,
        rollout_id: str,
        parent: str | None,
        prompt: list[int],
        response: list[int],
        *,
        start: float,
        end: float,
        agent: str | None = None,
        response_id: str | None = None,
        logprobs: list[float] | None = None,
        policy_version: int | None = 0,
        task: str = "t1",
        **cols: Any,
    ) -> str:
        return self.span(
            trace=rollout_id,
            name="chat test-model",
            start=start,
            end=end,
            parent=parent,
            span_type=sc.TYPE_LLM,
            rollout_id=rollout_id,
            task_id=task,
            agent_name=agent,
            model="test-model",
            response_id=response_id,
            prompt_token_ids=prompt,
            response_token_ids=response,
            response_logprobs=logprobs if logprobs is not None else [-0.5] * len(response or []),
            policy_version=policy_version,
            **{"token_source": sc.SOURCE_SERVER, **cols},
        )

    def reward(
        self,
        rollout_id: str,
        parent: str | None,
        value: float,
        *,
        at: float,
        name: str = "primary",
        agent: str | None = None,
        dims: dict[str, float] | None = None,
        final: bool = False,
        link: str | None = None,
    ) -> str:
        attrs: dict[str, Any] = {sc.REWARD_DIMENSIONS: dims or {name: value}}
        if final:
            attrs[sc.REWARD_FINAL] = True
        return self.span(
            trace=rollout_id,
            name=sc.REWARD_SPAN_NAME,
            start=at,
            end=at,
            parent=parent,
            span_type=sc.TYPE_REWARD,
            attributes=attrs,
            rollout_id=rollout_id,
            agent_name=agent,
            reward_name=name,
            reward_value=value,
            response_id=link,
        )

    def table(self) -> pa.Table:
        schema = schemas.spans()
        return pa.Table.from_pylist(self.rows, schema=schema)

    def write(self, folder: Path, name: str = "part-0.parquet") -> Path:
        path = folder / "date=2026-01-01" / "hour=00" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(self.table(), path)
        self.rows = []
        return path


@pytest.fixture
def rows() -> SpanRows:
    return SpanRows()
