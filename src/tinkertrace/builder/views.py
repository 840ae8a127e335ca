"""DuckDB views over a spans folder: ``spans``, ``llm_calls``, ``rewards`` and ``rollouts``.

Every view is ours, coalesced over the adapters (:mod:`tinkertrace.builder.adapters`): no producer is
named here. ``spans_typed`` is the raw span table with every other producer's spans mapped onto our
columns by its adapter (column ``producer`` names who wrote the row), and, when a build re-tokenised
text-only calls, their token ids joined in. ``spans`` adds the rollout each span belongs to: ours
(``tinkertrace.rollout.id``), the one its process names (an adapter's process-level rollout id;
column ``process_producer`` names that adapter), the one of the rollout root span in its trace, or,
for a trace where no span carries a rollout id at all, the trace itself (its root span is the
rollout, ``rollout_id`` the trace id, the task id read from ``task_key``, its status in
``plain_status`` from the root span's OTel status). ``agent_span_name`` is the agent name of agent
spans (ours, or an adapter's ``agent_name``), null on other spans.

Each ``create_*`` function takes the relations it reads and returns the name of the view it made.
The other three views' SQL (``llm_calls_sql``, ``rewards_sql``, ``rollouts_sql``) is defined over any
relation with the ``spans`` columns, so the build runs it over its materialised, token-free copy
(:mod:`tinkertrace.builder.stages`) and ``tinkertrace spans query`` over the view itself
(:func:`tinkertrace.builder.query.open_views`).
"""

from __future__ import annotations

import duckdb

from tinkertrace import semconv as sc
from tinkertrace.builder import adapters
from tinkertrace.builder.adapters import OURS
from tinkertrace.builder.adapters.base import MAPPABLE_COLUMNS
from tinkertrace.schemas.columns import TOKEN_COLUMNS
from tinkertrace.spanstore.sql import attr, attr_json

Relation = str
"""The name of a DuckDB view or table one build stage created and hands to the next."""

TYPED_VIEW = "spans_typed"
DEFAULT_TASK_KEY = sc.TASK_ID  # the attribute of a plain trace's root span naming its task

_A = "attributes"


def _attr(name: str) -> str:
    """SQL: the JSON value of attribute ``name`` as text (null when absent)."""
    return attr(name, _A)


def _attr_json(name: str) -> str:
    return attr_json(name, _A)


def typed_sql(raw: Relation, retokenized: Relation | None = None) -> str:
    """SQL of ``spans_typed``: each mapped column is ours where the row has it, else its adapter's
    expression (evaluated only for that adapter's rows), else the re-tokenised ids."""
    replaced = []
    for column in MAPPABLE_COLUMNS:
        parts = [f"t.{column}"]
        if mapped := adapters.column_sql(column, "t.producer"):
            parts.append(mapped)
        if retokenized and (column in TOKEN_COLUMNS or column == "token_source"):
            parts.append(f"rt.{column}")
        if len(parts) > 1:
            replaced.append(f"COALESCE({', '.join(parts)}) AS {column}")
    join = (
        f"LEFT JOIN {retokenized} rt ON rt.trace_id = t.trace_id AND rt.span_id = t.span_id"
        if retokenized
        else ""
    )
    return f"""
    SELECT t.* REPLACE ({", ".join(replaced)})
    FROM (SELECT r.*, {adapters.producer_sql()} AS producer FROM {raw} r) t {join}
    """


def span_tokens_sql(typed: Relation) -> str:
    """Token columns of the LLM spans of ``typed`` (any producer's, re-tokenised ones included), keyed
    by (trace_id, span_id, filename): what the builder joins its chosen calls with."""
    runs = f"TRY_CAST({_attr_json(sc.POLICY_VERSION_RUNS)} AS BIGINT[])"
    return f"""
    SELECT trace_id, span_id, filename, {", ".join(TOKEN_COLUMNS)},
           CASE WHEN contains({_A}, '{sc.POLICY_VERSION_RUNS}') THEN {runs} END AS policy_version_runs
    FROM {typed} WHERE span_type = '{sc.TYPE_LLM}'
    """


def _agent_span_name_sql() -> str:
    """SQL (over the typed row ``r``): the agent name of an agent span, else null. Agent spans are ours
    (``span_type = 'agent'``) and the spans without a span type an adapter names an agent."""
    return f"""CASE WHEN r.span_type = '{sc.TYPE_AGENT}' THEN r.agent_name
        WHEN r.span_type IS NULL THEN {adapters.process_sql("agent_name")} END"""


def _task_sql(task_key: str) -> str:
    """SQL: the task id a plain trace's root span names with attribute ``task_key`` (or its resource)."""
    return f"COALESCE({attr(task_key)}, {attr(task_key, 'resource_attributes')})"


def _plain_roots_sql(raw: Relation) -> str:
    """SQL: how many root spans of ``raw`` are not ours and carry no rollout id (0: no plain trace can
    be a rollout)."""
    return f"""SELECT count(*) FROM {raw}
    WHERE parent_span_id IS NULL AND span_type IS NULL AND rollout_id IS NULL"""


_PLAIN_STATUS_SQL = f"""CASE WHEN r.status_code = 'ERROR' THEN '{sc.STATUS_FAILED}'
    WHEN r.end_time IS NOT NULL THEN '{sc.STATUS_SUCCEEDED}' END"""
"""SQL: a plain trace's rollout status from its root span's OTel status: ``failed`` on ERROR, else
``succeeded`` once the span ended (OK or UNSET: OTel leaves a span that went well UNSET)."""


def _spans_sql(typed: Relation, task_key: str, plain_roots: bool) -> str:
    foreign = f"r.producer IS DISTINCT FROM '{OURS}'"
    process_rollout = f"CASE WHEN {foreign} THEN {adapters.process_sql('rollout_id')} END"
    task = "r.task_id" if task_key == DEFAULT_TASK_KEY else f"COALESCE(r.task_id, {_task_sql(task_key)})"
    # without a candidate root (the spans of our SDK alone) the implicit rollouts are known empty
    implicit = "" if plain_roots else "WHERE false"
    return f"""
    WITH roots AS (
        SELECT trace_id, min(rollout_id) AS rollout_id FROM {typed}
        WHERE span_type = '{sc.TYPE_ROLLOUT}' AND rollout_id IS NOT NULL GROUP BY trace_id
    ), candidates AS (  -- root spans of traces that may carry no rollout id at all
        SELECT trace_id, span_id, {task} AS task_id, start_time FROM {typed} r
        WHERE parent_span_id IS NULL AND rollout_id IS NULL AND {foreign} AND {process_rollout} IS NULL
    ), claimed AS (
        SELECT DISTINCT trace_id FROM {typed} r
        WHERE trace_id IN (SELECT trace_id FROM candidates)
          AND (rollout_id IS NOT NULL OR {process_rollout} IS NOT NULL)
    ), implicit AS (
        SELECT trace_id, span_id AS root_span_id, task_id FROM candidates ANTI JOIN claimed USING (trace_id)
        {implicit}
        QUALIFY row_number() OVER (PARTITION BY trace_id ORDER BY start_time, span_id) = 1
    ), typed AS (
        SELECT r.* REPLACE (
            CASE WHEN r.span_id = i.root_span_id AND r.span_type IS NULL THEN '{sc.TYPE_ROLLOUT}'
                 ELSE r.span_type END AS span_type,
            COALESCE(r.rollout_id, {process_rollout}, roots.rollout_id, i.trace_id) AS rollout_id,
            COALESCE(r.task_id, i.task_id) AS task_id,
            COALESCE(r.attempt, CASE WHEN {foreign} THEN {adapters.process_sql("attempt")} END) AS attempt
        ),
        CASE WHEN {foreign} THEN {adapters.process_producer_sql()} END AS process_producer,
        i.trace_id IS NOT NULL AS implicit_rollout,
        CASE WHEN r.span_id = i.root_span_id THEN {_PLAIN_STATUS_SQL} END AS plain_status,
        {_agent_span_name_sql()} AS agent_span_name,
        {llm_trainable_sql()} AS trainable,
        {server_side_sql()} AS server_side
        FROM {typed} r LEFT JOIN roots ON roots.trace_id = r.trace_id
        LEFT JOIN implicit i ON i.trace_id = r.trace_id
    )
    SELECT * FROM typed
    """


def _dimensions_sql() -> str:
    """SQL: MAP(name -> value) of a reward span's dimensions: ours, else its producer's (adapters)."""
    # the SDK stores the dimensions as JSON text; accept a JSON object too
    ours = f"TRY_CAST(TRY_CAST({_attr(sc.REWARD_DIMENSIONS)} AS JSON) AS MAP(VARCHAR, DOUBLE))"
    theirs = adapters.dimensions_sql()
    return f"COALESCE({ours}, {theirs})" if theirs else ours


def llm_trainable_sql() -> str:
    """SQL: whether a row of the ``spans`` view is an LLM call a trainer can use: it has prompt and
    response ids, neither empty (``[]`` means no ids), and does not say ``token_source = none``."""
    return f"""COALESCE(span_type = '{sc.TYPE_LLM}' AND token_source IS DISTINCT FROM '{sc.SOURCE_NONE}'
        AND len(prompt_token_ids) > 0 AND len(response_token_ids) > 0, false)"""


# Finish reasons that mean the token limit cut the response: OpenAI chat/completions and vLLM
# ("length"), the Responses API's incomplete_details.reason ("max_output_tokens"), Anthropic's
# stop_reason ("max_tokens").
TRUNCATION_REASONS = ("length", "max_output_tokens", "max_tokens")


def llm_truncated_sql() -> str:
    """SQL: whether an LLM span's response was cut short: a finish reason of :data:`TRUNCATION_REASONS`
    (ours: the list ``gen_ai.response.finish_reasons``; or one of the adapters' ``finish_reasons``) or a
    stream the agent closed before its end (``tinkertrace.llm.closed_early``). Null on other spans."""
    reasons = _attr_json(sc.GENAI_FINISH_REASONS)
    cut = ", ".join(f"'{r}'" for r in TRUNCATION_REASONS)
    theirs = "".join(f" OR {reason} IN ({cut})" for reason in adapters.finish_reasons())
    length = f"(list_has_any(TRY_CAST({reasons} AS VARCHAR[]), [{cut}]){theirs})"
    closed = f"TRY_CAST({_attr(sc.LLM_CLOSED_EARLY)} AS BOOLEAN)"
    # only other producers' spans and ours whose attributes mention either key pay for the JSON parsing
    mentioned = (
        f"(producer IS DISTINCT FROM '{OURS}' "
        "OR contains(attributes, 'finish_reason') OR contains(attributes, 'closed_early'))"
    )
    return f"""CASE WHEN span_type = '{sc.TYPE_LLM}' THEN
        COALESCE(CASE WHEN {mentioned} THEN COALESCE({length}, false) OR COALESCE({closed}, false) END,
                 false) END"""


def server_side_sql() -> str:
    """SQL: whether an LLM span was recorded by the serving endpoint (``tinkertrace.llm.capture_side``
    = server) rather than by the client (the SDK writes no side: client). Only spans whose attributes
    mention the key pay for the JSON parsing."""
    side = _attr(sc.LLM_CAPTURE_SIDE)
    return f"""COALESCE(span_type = '{sc.TYPE_LLM}' AND contains(attributes, 'capture_side')
        AND {side} = '{sc.CAPTURE_SERVER}', false)"""


def llm_calls_sql(source: str, *, mixed: bool = True) -> str:
    """One row per distinct LLM call of a rollout.

    Spans of the same call are one call: an LLM span nested in another of the same call (one of them
    without a response id, or the same one: an HTTP-level span, or our SDK's span inside OpenInference's)
    and spans sharing a ``gen_ai.response.id`` (the client's and the endpoint's record of a call, or
    two instrumentations in one process). A server-side span without a rollout takes the rollout of a
    client span of the same response id. Per call the row kept is the client's (its parent chain and
    agent scope), preferring one with token ids, then ours, then the earliest; its token ids come from
    the server side's span when that has them (``tok_trace_id``, ``tok_span_id``, ``filename``: the
    span whose token columns the triplet takes; without ``mixed`` they are the row's own, and the
    ``tok_*`` columns are left out).

    ``mixed=False`` says every LLM span of ``source`` is our SDK's, client side: then the inner span of
    a nested pair is simply dropped and the earliest span of a response id kept (what the full rule
    gives on such data), without the steps that key, adopt and prefer across producers and sides.
    """
    nested = """(p.span_id IS NOT NULL AND (p.response_id IS NULL OR l.response_id IS NULL
                  OR p.response_id = l.response_id))"""
    order = "start_time, end_time DESC, span_id, received_at, filename"
    if not mixed:
        return f"""
        WITH llm AS (SELECT * FROM {source} WHERE span_type = '{sc.TYPE_LLM}'),
        marked AS (
            SELECT l.*, {nested} AS nested_in_same_call
            FROM llm l LEFT JOIN (SELECT DISTINCT trace_id, span_id, response_id FROM llm) p
              ON p.trace_id = l.trace_id AND p.span_id = l.parent_span_id
        )
        SELECT * EXCLUDE (nested_in_same_call) FROM marked WHERE NOT nested_in_same_call
        QUALIFY row_number() OVER (
            PARTITION BY rollout_id, COALESCE(response_id, trace_id || span_id) ORDER BY {order}) = 1
        """
    return f"""
    WITH llm AS (SELECT * FROM {source} WHERE span_type = '{sc.TYPE_LLM}'),
    marked AS (
        SELECT l.*, {nested} AS nested_in_same_call,
               COALESCE(l.response_id, p.response_id, p.trace_id || p.span_id) AS nested_key
        FROM llm l LEFT JOIN (SELECT DISTINCT trace_id, span_id, response_id FROM llm) p
          ON p.trace_id = l.trace_id AND p.span_id = l.parent_span_id
    ), inner_keys AS (  -- an outer span of a nested pair is keyed like its inner one
        SELECT trace_id, parent_span_id, min(nested_key) AS key FROM marked
        WHERE nested_in_same_call GROUP BY ALL
    ), keyed AS (
        SELECT m.* EXCLUDE (nested_in_same_call, nested_key),
               CASE WHEN m.nested_in_same_call THEN m.nested_key
                    ELSE COALESCE(m.response_id, i.key, m.trace_id || m.span_id) END AS call_key
        FROM marked m LEFT JOIN inner_keys i
          ON i.trace_id = m.trace_id AND i.parent_span_id = m.span_id
    ), adopters AS (  -- rollout of a client span answering a server-side span that has none
        SELECT response_id, min(rollout_id) AS rollout_id, min(agent_name) AS agent_name FROM keyed
        WHERE rollout_id IS NOT NULL AND NOT server_side
          AND response_id IN (SELECT response_id FROM keyed WHERE rollout_id IS NULL)
        GROUP BY response_id
    ), adopted AS (
        SELECT k.* REPLACE (COALESCE(k.rollout_id, a.rollout_id) AS rollout_id,
                            COALESCE(k.agent_name, a.agent_name) AS agent_name)
        FROM keyed k LEFT JOIN adopters a ON k.rollout_id IS NULL AND a.response_id = k.response_id
    ), server_tokens AS (  -- the endpoint's exact record of a call, where it has token ids
        SELECT rollout_id, call_key, trace_id AS tok_trace_id, span_id AS tok_span_id,
               filename AS tok_filename, token_source AS tok_source, policy_version AS tok_policy_version
        FROM adopted WHERE server_side AND trainable
        QUALIFY row_number() OVER (PARTITION BY rollout_id, call_key
                                   ORDER BY start_time, span_id, received_at, filename) = 1
    ), chosen AS (
        SELECT * FROM adopted
        QUALIFY row_number() OVER (
            PARTITION BY rollout_id, call_key
            ORDER BY server_side, trainable DESC, COALESCE(producer, '{OURS}') = '{OURS}' DESC, {order}) = 1
    )
    SELECT c.* EXCLUDE (call_key) REPLACE (COALESCE(s.tok_filename, c.filename) AS filename,
                        c.trainable OR s.tok_trace_id IS NOT NULL AS trainable,
                        COALESCE(s.tok_source, c.token_source) AS token_source,
                        COALESCE(s.tok_policy_version, c.policy_version) AS policy_version),
           COALESCE(s.tok_trace_id, c.trace_id) AS tok_trace_id,
           COALESCE(s.tok_span_id, c.span_id) AS tok_span_id
    FROM chosen c LEFT JOIN server_tokens s USING (rollout_id, call_key)
    """


def rewards_sql(source: str) -> str:
    """One row per reward span: primary name/value, all dimensions, final flag, linked response id."""
    return f"""
    SELECT trace_id, span_id, parent_span_id, rollout_id, task_id, agent_name, start_time, end_time,
           COALESCE(reward_name, '{sc.PRIMARY_REWARD}') AS name, reward_value AS value,
           {_dimensions_sql()} AS dimensions,
           COALESCE(TRY_CAST({_attr(sc.REWARD_FINAL)} AS BOOLEAN), false) AS is_final,
           response_id AS linked_response_id
    FROM {source} WHERE span_type = '{sc.TYPE_REWARD}'
    QUALIFY row_number() OVER (PARTITION BY trace_id, span_id ORDER BY received_at) = 1
    """


def rollouts_sql(source: str) -> str:
    """One row per rollout id: root fields, span counts and completeness (``incomplete_reason``;
    ``uncounted``: its producer records no counts to check, as for plain traces: complete)."""
    unchecked = ", ".join(f"'{name}'" for name in adapters.unchecked_producers()) or "NULL"
    return f"""
    WITH u AS (
        SELECT * FROM {source} WHERE rollout_id IS NOT NULL
        QUALIFY row_number() OVER (PARTITION BY trace_id, span_id ORDER BY received_at) = 1
    ), root AS (
        SELECT rollout_id, span_id AS root_span_id, start_time, end_time, task_id, attempt, split,
               COALESCE({_attr(sc.ROLLOUT_STATUS)}, plain_status) AS status,
               TRY_CAST({_attr(sc.ROLLOUT_LLM_CALLS)} AS BIGINT) AS expected_llm_calls,
               TRY_CAST({_attr(sc.ROLLOUT_REWARDS)} AS BIGINT) AS expected_rewards
        FROM u WHERE span_type = '{sc.TYPE_ROLLOUT}'
        QUALIFY row_number() OVER (PARTITION BY rollout_id ORDER BY start_time, span_id) = 1
    ), stats AS (
        SELECT rollout_id, count(*) AS spans,
               count(*) FILTER (WHERE span_type = '{sc.TYPE_LLM}') AS llm_spans,
               count(*) FILTER (WHERE span_type = '{sc.TYPE_REWARD}') AS reward_spans,
               min(start_time) AS first_start, max(end_time) AS last_end,
               min(task_id) AS any_task, min(attempt) AS any_attempt, min(split) AS any_split,
               bool_and(COALESCE(process_producer IN ({unchecked}), false)) AS uncounted,
               bool_and(implicit_rollout) AS implicit
        FROM u GROUP BY rollout_id
    )
    SELECT s.rollout_id,
           COALESCE(root.task_id, s.any_task) AS task_id,
           COALESCE(root.attempt, s.any_attempt) AS attempt,
           COALESCE(root.split, s.any_split) AS split,
           COALESCE(root.start_time, s.first_start) AS start_time,
           COALESCE(root.end_time, s.last_end) AS end_time,
           root.status, root.root_span_id, root.expected_llm_calls, root.expected_rewards,
           s.spans, s.llm_spans, s.reward_spans, s.uncounted,
           CASE WHEN s.uncounted OR s.implicit THEN NULL  -- no root counts to check
                WHEN root.rollout_id IS NULL THEN 'root_missing'
                WHEN s.llm_spans < COALESCE(root.expected_llm_calls, 0) THEN 'missing_llm_spans'
                WHEN s.reward_spans < COALESCE(root.expected_rewards, 0) THEN 'missing_reward_spans'
           END AS incomplete_reason
    FROM stats s LEFT JOIN root USING (rollout_id)
    """


def create_typed(
    con: duckdb.DuckDBPyConnection,
    raw: Relation,
    retokenized: Relation | None = None,
    *,
    name: Relation = TYPED_VIEW,
) -> Relation:
    """Create view ``name``: the span rows of ``raw`` with every producer's columns mapped by its
    adapter (and the token ids of ``retokenized`` for the calls it rebuilt); returns ``name``."""
    con.execute(f"CREATE OR REPLACE VIEW {name} AS {typed_sql(raw, retokenized)}")
    return name


def create_spans(
    con: duckdb.DuckDBPyConnection,
    raw: Relation,
    typed: Relation,
    *,
    task_key: str = DEFAULT_TASK_KEY,
    name: Relation = "spans",
) -> Relation:
    """Create view ``name``: ``typed`` with each span's rollout (a plain trace's task id read from its
    root span's attribute ``task_key``); ``raw`` tells whether any trace can be a plain one."""
    plain_roots = con.execute(_plain_roots_sql(raw)).fetchone()[0] > 0  # type: ignore[index]
    con.execute(f"CREATE OR REPLACE VIEW {name} AS {_spans_sql(typed, task_key, plain_roots)}")
    return name


def create_derived_views(
    con: duckdb.DuckDBPyConnection, source: Relation = "spans", *, mixed: bool = True
) -> None:
    """Create ``llm_calls``, ``rewards`` and ``rollouts`` over ``source`` (a relation with span columns;
    ``mixed=False`` when its LLM spans are known to be all our SDK's, client side)."""
    con.execute(f"CREATE OR REPLACE VIEW llm_calls AS {llm_calls_sql(source, mixed=mixed)}")
    con.execute(f"CREATE OR REPLACE VIEW rewards AS {rewards_sql(source)}")
    con.execute(f"CREATE OR REPLACE VIEW rollouts AS {rollouts_sql(source)}")
