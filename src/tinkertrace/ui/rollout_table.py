"""The ui's span index and rollout table, built with the builder's own relations.

Each new span file goes through the builder's ``spans_typed`` view (:func:`tinkertrace.builder.views.
create_typed`: every producer's columns mapped by its adapter) into the in-memory table ``span_index``:
one small row per span, no token lists, JSON attributes kept only where the builder's rollout rules
read them (rollout roots and other producers' spans). After each change the builder's ``spans`` view
(:func:`~tinkertrace.builder.views.create_spans`: which rollout each span belongs to, for our SDK,
the recording endpoint, Agent-lightning and plain traces alike) and its ``rollouts`` relation
(:func:`~tinkertrace.builder.views.rollouts_sql`: root fields and completeness) are run over that
index, and the ui adds its list columns (reward, calls, tokens, agents, outcome) from the same spans.
So the list shows the rollouts a build makes, by the same SQL text.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import duckdb

from tinkertrace import semconv as sc
from tinkertrace.builder import views
from tinkertrace.builder.adapters import OURS
from tinkertrace.spanstore.reader import empty_spans_sql
from tinkertrace.spanstore.sql import attr, literal_list
from tinkertrace.ui import outcomes

_ROOT = f"span_type = '{sc.TYPE_ROLLOUT}'"
_LLM = f"span_type = '{sc.TYPE_LLM}'"
_REWARD = f"span_type = '{sc.TYPE_REWARD}'"
_KEEP_JSON = f"{_ROOT} OR producer IS DISTINCT FROM '{OURS}'"  # the rows whose JSON the rules read


# One row per span (the builder's typed columns), no token lists.
_SPAN_ROW_SQL = f"""
SELECT trace_id, span_id, parent_span_id, name, kind, span_type, rollout_id, task_id, attempt, split,
       agent_name, model, response_id, reward_name, reward_value, token_source, policy_version,
       start_time, end_time, received_at, status_code, status_message, producer,
       epoch_ns(start_time) AS start_ns, epoch_ns(end_time) AS end_ns, epoch_ns(received_at) AS received_ns,
       CAST(len(prompt_token_ids) AS INTEGER) AS prompt_tokens,
       CAST(len(response_token_ids) AS INTEGER) AS response_tokens,
       CASE WHEN {_KEEP_JSON} THEN attributes END AS attributes,
       CASE WHEN producer IS DISTINCT FROM '{OURS}' THEN resource_attributes END AS resource_attributes,
       filename
FROM {{source}}
"""

# The index as the builder's views read it: its rows with (empty) token lists.
INDEX_AS_SPANS = "_ui_span_rows"
SPANS = "ui_spans"  # the builder's spans view over the index: each span with its rollout


def create_index(con: duckdb.DuckDBPyConnection) -> None:
    """Create the empty ``span_index`` and the views over it."""
    con.execute(f"CREATE OR REPLACE TEMP VIEW _ui_raw AS {empty_spans_sql()}")
    views.create_typed(con, "_ui_raw", name="_ui_typed")
    con.execute(f"CREATE TABLE span_index AS {_SPAN_ROW_SQL.format(source='_ui_typed')}")
    con.execute(
        f"CREATE OR REPLACE VIEW {INDEX_AS_SPANS} AS SELECT *, NULL::INTEGER[] AS prompt_token_ids, "
        "NULL::INTEGER[] AS response_token_ids FROM span_index"
    )


def ingest(con: duckdb.DuckDBPyConnection, files: Sequence[Path]) -> None:
    """Add the rows of ``files`` (span Parquet, flat or partitioned) to ``span_index``."""
    listing = f"[{literal_list(files)}]"
    con.execute(
        f"CREATE OR REPLACE TEMP VIEW _ui_raw AS SELECT * FROM ({empty_spans_sql()}) UNION ALL BY NAME "
        f"SELECT * FROM read_parquet({listing}, union_by_name = true, filename = true, "
        "hive_partitioning = false)"
    )
    views.create_typed(con, "_ui_raw", name="_ui_typed")
    con.execute(f"INSERT INTO span_index {_SPAN_ROW_SQL.format(source='_ui_typed')}")


# The list's columns per rollout: the builder's rollout row plus what the ui counts over its spans.
_ROLLOUTS_SQL = f"""
WITH s AS (
    SELECT * FROM {SPANS} WHERE rollout_id IS NOT NULL
    QUALIFY row_number() OVER (PARTITION BY trace_id, span_id ORDER BY received_at, filename) = 1
), b AS ({views.rollouts_sql(SPANS)}), agg AS (
    SELECT rollout_id,
           array_to_string(list_sort(list_distinct(list(agent_name))), ', ') AS agents,
           sum(reward_value) FILTER (WHERE {_REWARD}) AS reward,
           count(*) FILTER (WHERE {_LLM}) AS turns,
           COALESCE(sum(response_tokens) FILTER (WHERE {_LLM}), 0) AS tokens,
           min(policy_version) FILTER (WHERE {_LLM}) AS policy_version,
           count(*) FILTER (WHERE token_source = '{sc.SOURCE_RETOKENIZED}') AS retokenized_calls,
           count(*) FILTER (WHERE {_LLM} AND (COALESCE(prompt_tokens, 0) = 0
                OR COALESCE(response_tokens, 0) = 0 OR token_source = '{sc.SOURCE_NONE}'))
                AS calls_without_ids,
           max(left({attr(sc.TASK_INPUT)}, 400)) FILTER (WHERE {_ROOT}) AS task_input
    FROM s GROUP BY rollout_id
)
SELECT r.*, {outcomes.OUTCOME_SQL} AS outcome FROM (
    SELECT b.rollout_id, b.task_id, b.attempt, b.split, agg.agents, COALESCE(b.status, 'unknown') AS status,
           agg.* EXCLUDE (rollout_id, agents), b.spans, b.expected_llm_calls, b.expected_rewards,
           epoch_ns(b.start_time) AS start_ns, epoch_ns(b.end_time) AS end_ns,
           b.incomplete_reason AS incomplete,
           (epoch_ns(b.end_time) - epoch_ns(b.start_time)) / 1e9 AS duration_s,
           epoch_ns(b.start_time) // 1000000 AS start_ms,
           fates.* EXCLUDE (rollout_id),
           lower(concat_ws(' ', b.rollout_id, b.task_id, agg.agents, agg.task_input)) AS haystack
    FROM b JOIN agg USING (rollout_id) LEFT JOIN fates USING (rollout_id)
) r
"""


def rebuild(con: duckdb.DuckDBPyConnection) -> None:
    """(Re)build ``rollouts`` (one row per rollout) and ``trace_rollouts`` (which traces hold which
    rollout's spans) from ``span_index`` and ``fates``."""
    views.create_spans(con, "span_index", INDEX_AS_SPANS, name=SPANS)
    con.execute(f"CREATE OR REPLACE TABLE rollouts AS {_ROLLOUTS_SQL}")
    con.execute(
        "CREATE OR REPLACE TABLE trace_rollouts AS "
        f"SELECT DISTINCT trace_id, rollout_id FROM {SPANS} WHERE rollout_id IS NOT NULL"
    )
