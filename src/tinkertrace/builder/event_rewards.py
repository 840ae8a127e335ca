"""The build's stage after :func:`tinkertrace.builder.stages.spans`: GenAI evaluation events as rewards.

``gen_ai.evaluation.result`` is the GenAI conventions' way of scoring a call from any language: an
event on a span, or an OTLP log record of that span. Each becomes a reward row of the token-free
spans table, so every reward policy treats it like a reward span.
"""

from __future__ import annotations

import duckdb

from tinkertrace import semconv as sc
from tinkertrace.builder.sources import Sources
from tinkertrace.builder.stages import drop, scalar
from tinkertrace.builder.views import Relation
from tinkertrace.spanstore.sql import attr


def add_event_rewards(con: duckdb.DuckDBPyConnection, table: Relation, sources: Sources) -> Relation:
    """Add a reward row to ``table`` for every ``gen_ai.evaluation.result`` event on a span (the GenAI
    way of scoring, from any language): a child of that span at the event's time, named by
    ``gen_ai.evaluation.name``, valued ``gen_ai.evaluation.score.value``, linked to the call of its
    ``gen_ai.response.id``; the same events sent as OTLP log records of a span (``sources.logs``) too.
    Only spans whose events mention the name are parsed. Returns ``table``."""
    event = sc.REWARD_SPAN_NAME
    carrier = (
        "s.trace_id, s.span_id AS carrier, s.rollout_id, s.task_id, s.attempt, s.split, s.agent_name, "
        "s.received_at, s.process_producer, s.implicit_rollout, s.producer"
    )
    # the carriers' columns come from the table; only the raw events column is scanned, once
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _carriers AS SELECT DISTINCT trace_id, span_id, events
        FROM {sources.raw} WHERE contains(events, '{event}')""")
    logged = scalar(con, f"SELECT count(*) FROM {sources.logs} WHERE event_name = '{event}'")
    if not logged and not scalar(con, "SELECT count(*) FROM _carriers"):
        drop(con, "_carriers")
        return table
    from_logs = ""
    if logged:
        from_logs = f"""UNION ALL BY NAME  -- the same events sent as OTLP log records of the span
            SELECT {carrier}, 'log' || row_number() OVER (PARTITION BY l.trace_id, l.span_id
                                                            ORDER BY l.time, l.received_at) AS i,
                   l.attributes, COALESCE(l.time, l.observed_time)::TIMESTAMPTZ AS event_time
            FROM {sources.logs} l JOIN {table} s ON s.trace_id = l.trace_id AND s.span_id = l.span_id
            WHERE l.event_name = '{event}'"""
    con.execute(f"""
        INSERT INTO {table} BY NAME
        WITH e AS (
            SELECT {carrier}, unnest(CAST(r.events AS JSON[])) AS ev,
                   'event' || generate_subscripts(CAST(r.events AS JSON[]), 1) AS i
            FROM _carriers r JOIN {table} s ON s.trace_id = r.trace_id AND s.span_id = r.span_id
        ), scored AS (
            SELECT * EXCLUDE (ev), json_extract_string(ev, '$.attributes') AS attributes,
                   to_timestamp(0) + to_microseconds(
                       CAST(json_extract_string(ev, '$.time_unix_nano') AS BIGINT) // 1000)
                       AS event_time
            FROM e WHERE json_extract_string(ev, '$.name') = '{event}'
            {from_logs}
        )
        SELECT trace_id, carrier || '/' || i AS span_id, carrier AS parent_span_id, '{event}' AS name,
               event_time AS start_time, event_time AS end_time, '{sc.TYPE_REWARD}' AS span_type,
               rollout_id, task_id, attempt, split, agent_name, received_at, process_producer,
               implicit_rollout, producer,
               COALESCE({attr(sc.GENAI_EVALUATION_NAME)}, '{sc.PRIMARY_REWARD}') AS reward_name,
               TRY_CAST({attr(sc.GENAI_EVALUATION_SCORE)} AS DOUBLE) AS reward_value,
               {attr(sc.GENAI_RESPONSE_ID)} AS response_id, attributes,
               NULL AS agent_span_name, false AS trainable, false AS server_side
        FROM scored WHERE {attr(sc.GENAI_EVALUATION_SCORE)} IS NOT NULL""")
    drop(con, "_carriers")
    return table
