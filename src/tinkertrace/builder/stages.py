"""The token-free stages of the build, from the ``spans`` view to the calls to emit (SQL).

Each stage takes the relations it reads as arguments, creates one table (named after what it holds)
and returns its name; the working tables a stage needs on the way are its own and dropped before it
returns. Each also fills the summary counts it knows. :func:`tinkertrace.builder.build` runs them in
order (:mod:`.event_rewards` after :func:`spans`, :mod:`.rewards` after :func:`rewards`) and
:func:`tinkertrace.builder.stream.triplet_stream` then joins the chosen calls with their token
columns, bucket by bucket.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa

from tinkertrace import semconv as sc
from tinkertrace.builder import views
from tinkertrace.builder.adapters import OURS
from tinkertrace.builder.options import BuildSettings
from tinkertrace.builder.summary import BuildSummary
from tinkertrace.builder.views import Relation
from tinkertrace.schemas.columns import TOKEN_COLUMNS

SPANS, ROLLOUTS, SCOPES, PARENTS = "_spans", "_rollouts", "_scopes", "_parents"
CALLS, REWARDS, CHOSEN = "_calls", "_rewards", "_chosen"


def scalar(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, object] | None = None) -> int:
    """The integer ``sql`` selects (0 for no row or null)."""
    row = con.execute(sql, params or {}).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def spans(con: duckdb.DuckDBPyConnection, spans_view: Relation, summary: BuildSummary) -> Relation:
    """``spans_view`` (the ``spans`` view: every producer's spans with their rollout) materialised
    without token ids or the columns no later stage reads; counts the spans, by producer."""
    keep_attrs = f"span_type IN ('{sc.TYPE_ROLLOUT}', '{sc.TYPE_REWARD}') OR process_producer IS NOT NULL"
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE {SPANS} AS
        SELECT * EXCLUDE ({", ".join(TOKEN_COLUMNS)}, attributes, resource_attributes, events, links,
                          kind, status_code, status_message, service_name, scope_name, date, hour)
                 REPLACE (CASE WHEN span_type = '{sc.TYPE_LLM}' THEN filename END AS filename,
                          CASE WHEN span_type = '{sc.TYPE_REWARD}' THEN name END AS name,
                          -- null for ours (most rows: nothing to carry), 'unrecognised' for no adapter's
                          CASE WHEN producer IS DISTINCT FROM '{OURS}'
                               THEN COALESCE(producer, 'unrecognised') END AS producer),
               CASE WHEN {keep_attrs} THEN attributes END AS attributes,
               {views.llm_truncated_sql()} AS truncated
        FROM {spans_view}""")  # only LLM calls need their file (the token join) and rewards their name
    summary.spans = scalar(con, f"SELECT count(*) FROM {SPANS}")
    summary.spans_without_rollout = scalar(con, f"SELECT count(*) FROM {SPANS} WHERE rollout_id IS NULL")
    llm = f"span_type = '{sc.TYPE_LLM}'"
    for where, counts in (("true", summary.spans_by_producer), (llm, summary.llm_spans_by_producer)):
        rows = con.execute(
            f"SELECT COALESCE(producer, '{OURS}'), count(*) FROM {SPANS} WHERE {where} GROUP BY 1"
        )
        counts.update(dict(rows.fetchall()))
    return SPANS


def rollouts(
    con: duckdb.DuckDBPyConnection, spans: Relation, options: BuildSettings, summary: BuildSummary
) -> Relation:
    """The rollouts of ``spans`` to build (``views.rollouts_sql`` rows), after the options' filters;
    counts what each filter left out."""
    con.register(
        "_excluded_arrow", pa.table({"rollout_id": pa.array(sorted(options.exclude_rollouts), pa.string())})
    )
    con.execute(f"CREATE OR REPLACE TEMP TABLE _all_rollouts AS {views.rollouts_sql(spans)}")
    con.execute("""
        CREATE OR REPLACE TEMP TABLE _candidates AS
        SELECT * FROM _all_rollouts ANTI JOIN _excluded_arrow USING (rollout_id)""")
    summary.rollouts_seen = scalar(con, "SELECT count(*) FROM _all_rollouts")
    summary.rollouts_excluded = summary.rollouts_seen - scalar(con, "SELECT count(*) FROM _candidates")
    summary.rollouts_incomplete = dict(
        con.execute("""SELECT incomplete_reason, count(*) FROM _candidates
                       WHERE incomplete_reason IS NOT NULL GROUP BY ALL ORDER BY 1""").fetchall()
    )
    incomplete = con.execute(
        "SELECT rollout_id, reward_spans > 0 FROM _candidates WHERE incomplete_reason IS NOT NULL ORDER BY 1"
    ).fetchall()
    summary.incomplete_rollout_ids = [r[0] for r in incomplete]
    summary.incomplete_rollouts_rewarded = sum(1 for r in incomplete if r[1])
    summary.incomplete_included = options.include_incomplete
    pool = "true" if options.include_incomplete else "incomplete_reason IS NULL"
    where = [pool]
    params: dict[str, object] = {}
    if options.statuses:
        status = "COALESCE(status, 'unknown') IN (SELECT unnest($statuses))"
        params["statuses"] = list(options.statuses)
        summary.rollouts_status_filtered = scalar(
            con, f"SELECT count(*) FROM _candidates WHERE {pool} AND NOT {status}", params
        )
        where.append(status)
    if options.since is not None:
        where.append("start_time::TIMESTAMPTZ >= $since")
        params["since"] = options.since
    if options.until is not None:
        where.append("start_time::TIMESTAMPTZ < $until")
        params["until"] = options.until
    if options.splits:
        where.append("split IN (SELECT unnest($splits))")
        params["splits"] = list(options.splits)
    if options.tasks:
        where.append("task_id IN (SELECT unnest($tasks))")
        params["tasks"] = list(options.tasks)
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE {ROLLOUTS} AS SELECT * FROM _candidates WHERE {' AND '.join(where)}",
        params,
    )
    summary.rollouts_built = scalar(con, f"SELECT count(*) FROM {ROLLOUTS}")
    complete = scalar(con, "SELECT count(*) FROM _candidates WHERE incomplete_reason IS NULL")
    considered = summary.rollouts_seen - summary.rollouts_excluded
    summary.rollouts_filtered = (
        (considered if options.include_incomplete else complete)
        - summary.rollouts_status_filtered
        - summary.rollouts_built
    )
    summary.rollouts_failed = scalar(
        con, f"SELECT count(*) FROM {ROLLOUTS} WHERE status = '{sc.STATUS_FAILED}'"
    )
    ids = con.execute(f"SELECT rollout_id FROM {ROLLOUTS} ORDER BY 1").fetchall()
    summary.rollout_ids = [r[0] for r in ids]
    con.unregister("_excluded_arrow")
    drop(con, "_all_rollouts", "_candidates")
    return ROLLOUTS


def parents(
    con: duckdb.DuckDBPyConnection,
    spans: Relation,
    rollouts: Relation,
    options: BuildSettings,
    summary: BuildSummary,
) -> Relation | None:
    """Count spans of the built rollouts whose parent is missing; for the ``sibling`` policy (the only
    one that reads parents) return the table ``(trace_id, span_id, parent)`` of LLM and reward spans,
    where a missing parent is replaced by the innermost enclosing (non-LLM, non-reward) span of the
    same rollout; None otherwise."""
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _orphans AS
        SELECT DISTINCT m.trace_id, m.span_id, m.rollout_id, m.start_time, m.end_time
        FROM (SELECT * FROM {spans} SEMI JOIN {rollouts} USING (rollout_id)) m
        ANTI JOIN (SELECT DISTINCT trace_id, span_id FROM {spans}) p
          ON p.trace_id = m.trace_id AND p.span_id = m.parent_span_id
        WHERE m.parent_span_id IS NOT NULL""")
    summary.orphan_spans_repaired = scalar(con, "SELECT count(*) FROM _orphans")
    if options.reward_policy != "sibling":
        drop(con, "_orphans")
        return None
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE {PARENTS} AS
        WITH containers AS (
            SELECT DISTINCT span_id, rollout_id, start_time, end_time FROM {spans}
            WHERE rollout_id IN (SELECT rollout_id FROM _orphans)
              AND span_type IS DISTINCT FROM '{sc.TYPE_LLM}' AND span_type IS DISTINCT FROM '{sc.TYPE_REWARD}'
        ), repaired AS (
            SELECT o.trace_id, o.span_id, c.span_id AS parent FROM _orphans o
            LEFT JOIN containers c ON c.rollout_id = o.rollout_id AND c.span_id <> o.span_id
                 AND c.start_time <= o.start_time AND c.end_time >= o.end_time
            QUALIFY row_number() OVER (PARTITION BY o.trace_id, o.span_id
                                       ORDER BY c.start_time DESC, c.end_time, c.span_id) = 1
        )
        SELECT DISTINCT s.trace_id, s.span_id, COALESCE(r.parent, s.parent_span_id) AS parent
        FROM {spans} s SEMI JOIN {rollouts} USING (rollout_id)
        LEFT JOIN repaired r USING (trace_id, span_id)
        WHERE s.span_type IN ('{sc.TYPE_LLM}', '{sc.TYPE_REWARD}')""")
    drop(con, "_orphans")
    return PARENTS


MAX_AGENT_DEPTH = 64  # ancestors walked up to find a span's agent span


def agent_scopes(con: duckdb.DuckDBPyConnection, spans: Relation, rollouts: Relation) -> Relation:
    """The table ``(trace_id, span_id, scope, scope_agent)``: for each LLM and reward span of the
    built rollouts, its nearest enclosing agent span (``views`` column ``agent_span_name``) and that
    span's agent name; spans under no agent span have no row. One recursive walk up the parent ids,
    through the spans that can enclose others (neither LLM calls nor rewards).

    An LLM call whose parent chain holds no agent span (made on a thread without context: a root span
    of its own trace, or its parent lost) takes, as Agent-lightning's adapter repairs hierarchies, the
    agent span of its rollout that encloses it in time: the innermost one whose [start, end] holds the
    call's start (the latest-starting; ties: the shortest), of the call's own agent name if it has one.
    """
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE {SCOPES} AS
        WITH RECURSIVE built AS (SELECT * FROM {spans} SEMI JOIN {rollouts} USING (rollout_id)),
        nodes AS (
            SELECT trace_id, span_id, any_value(parent_span_id) AS parent_span_id,
                   any_value(agent_span_name) AS agent_span_name
            FROM built WHERE span_type IS NULL OR span_type NOT IN ('{sc.TYPE_LLM}', '{sc.TYPE_REWARD}')
            GROUP BY trace_id, span_id
        ), walk(trace_id, span_id, cur, scope, scope_agent, depth) AS (
            SELECT trace_id, span_id, any_value(parent_span_id), NULL::VARCHAR, NULL::VARCHAR, 0
            FROM built WHERE span_type IN ('{sc.TYPE_LLM}', '{sc.TYPE_REWARD}') GROUP BY trace_id, span_id
            UNION ALL
            SELECT w.trace_id, w.span_id, n.parent_span_id,
                   CASE WHEN n.agent_span_name IS NOT NULL THEN n.span_id END, n.agent_span_name, w.depth + 1
            FROM walk w JOIN nodes n ON n.trace_id = w.trace_id AND n.span_id = w.cur
            WHERE w.scope IS NULL AND w.depth < {MAX_AGENT_DEPTH}
        ), found AS (
            SELECT trace_id, span_id, scope, scope_agent FROM walk WHERE scope IS NOT NULL
        ), agents AS (
            SELECT rollout_id, span_id, any_value(agent_span_name) AS name,
                   min(start_time) AS start_time, max(end_time) AS end_time
            FROM built WHERE agent_span_name IS NOT NULL GROUP BY rollout_id, trace_id, span_id
        ), lost AS (  -- calls under no agent span, in rollouts that have agent spans
            SELECT trace_id, span_id, any_value(rollout_id) AS rollout_id,
                   any_value(start_time) AS start_time, any_value(agent_name) AS agent_name
            FROM (SELECT * FROM built SEMI JOIN agents USING (rollout_id)) b
            ANTI JOIN found USING (trace_id, span_id)
            WHERE span_type = '{sc.TYPE_LLM}' GROUP BY trace_id, span_id
        ), by_time AS (
            SELECT l.trace_id, l.span_id, a.span_id AS scope, a.name AS scope_agent
            FROM lost l JOIN agents a ON a.rollout_id = l.rollout_id
                 AND a.start_time <= l.start_time AND l.start_time <= a.end_time
                 AND (l.agent_name IS NULL OR l.agent_name = a.name)
            QUALIFY row_number() OVER (PARTITION BY l.trace_id, l.span_id
                                       ORDER BY a.start_time DESC, a.end_time, a.span_id) = 1
        )
        SELECT * FROM found UNION ALL SELECT * FROM by_time""")
    return SCOPES


def _parent_join(parents: Relation | None) -> tuple[str, str]:
    """(column expression, join clause) giving each call/reward its parent (sibling policy only)."""
    if parents is not None:
        return "p.parent", f"LEFT JOIN {parents} p USING (trace_id, span_id)"
    return "NULL::VARCHAR AS parent", ""


def calls(
    con: duckdb.DuckDBPyConnection,
    spans: Relation,
    rollouts: Relation,
    scopes: Relation,
    parents: Relation | None,
    summary: BuildSummary,
) -> Relation:
    """The distinct LLM calls of the built rollouts (``views.llm_calls_sql``), each with its rollout's
    fields, agent, scope, parent and ``turn`` (its position in the rollout by time)."""
    mixed = scalar(
        con,
        f"SELECT count(*) FROM {spans} WHERE span_type = '{sc.TYPE_LLM}' "
        "AND (server_side OR producer IS NOT NULL)",
    )  # 0: every LLM span is our SDK's, client side (the simpler rule suffices)
    parent, join = _parent_join(parents)
    # the span whose token columns a call takes, when it is not the call's own (llm_calls_sql)
    tokens_of = "c.tok_trace_id, c.tok_span_id," if mixed else ""
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE {CALLS} AS
        SELECT c.trace_id, c.span_id, {tokens_of} c.filename, c.received_at, {parent},
               c.rollout_id, r.task_id, r.attempt,
               COALESCE(c.agent_name, c.agent_span_name, s.scope_agent) AS agent_name, s.scope,
               c.model, c.response_id, c.policy_version, c.token_source, c.trainable, c.truncated,
               c.start_time, c.end_time, r.split, r.end_time AS rollout_end,
               CAST(row_number() OVER (PARTITION BY c.rollout_id
                    ORDER BY c.start_time, c.end_time, c.trace_id, c.span_id) - 1 AS INTEGER) AS turn
        FROM ({views.llm_calls_sql(spans, mixed=mixed > 0)}) c JOIN {rollouts} r USING (rollout_id)
        LEFT JOIN {scopes} s USING (trace_id, span_id)
        {join}""")
    summary.llm_calls = scalar(con, f"SELECT count(*) FROM {CALLS}")
    summary.llm_calls_without_tokens = scalar(con, f"SELECT count(*) FROM {CALLS} WHERE NOT trainable")
    summary.llm_spans = scalar(
        con,
        f"SELECT count(DISTINCT (trace_id, span_id)) FROM {spans} SEMI JOIN {rollouts} USING (rollout_id) "
        f"WHERE span_type = '{sc.TYPE_LLM}'",
    )
    summary.llm_duplicates = summary.llm_spans - summary.llm_calls
    return CALLS


def rewards(
    con: duckdb.DuckDBPyConnection,
    spans: Relation,
    rollouts: Relation,
    scopes: Relation,
    parents: Relation | None,
    options: BuildSettings,
    summary: BuildSummary,
) -> Relation:
    """The reward spans of the built rollouts (``views.rewards_sql``) with their scope, parent and
    ``v``, the value of the reward the options name (null where a reward lacks that dimension)."""
    parent, join = _parent_join(parents)
    # the dimensions MAP is parsed from JSON only when a dimension is named
    value = "w.value"
    if options.reward_name is not None:
        value = "CASE WHEN w.name = $name THEN w.value ELSE CAST(w.dimensions[$name] AS DOUBLE) END"
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE {REWARDS} AS
        SELECT w.trace_id, w.span_id, w.rollout_id, w.start_time, w.end_time, w.is_final,
               w.linked_response_id, {parent}, s.scope, {value} AS v
        FROM ({views.rewards_sql(spans)}) w JOIN {rollouts} USING (rollout_id)
        LEFT JOIN {scopes} s USING (trace_id, span_id)
        {join}""",
        {"name": options.reward_name} if options.reward_name is not None else {},
    )
    summary.rewards = scalar(con, f"SELECT count(*) FROM {REWARDS}")
    summary.rewards_missing_dimension = scalar(con, f"SELECT count(*) FROM {REWARDS} WHERE v IS NULL")
    return REWARDS


def chosen_calls(
    con: duckdb.DuckDBPyConnection,
    calls: Relation,
    assigned: Relation,
    options: BuildSettings,
    summary: BuildSummary,
    buckets: int,
) -> Relation:
    """The calls to write (trainable, passing ``--agent`` / ``--min-policy-version``) with their reward,
    trajectory reward, ``group_key``, ``call_no`` (position in the output order) and ``bucket``
    (``buckets`` equal-count ranges of ``call_no``: :mod:`tinkertrace.builder.stream`)."""
    if options.group_by == "task":
        group_key = "COALESCE(c.task_id, c.rollout_id)"
    else:
        group_key = "COALESCE(c.task_id, c.rollout_id) || '::' || COALESCE(c.agent_name, '')"
    # Trajectory reward: the rollout's final reward under `final`, else the sum of the rewards
    # assigned to the (rollout, agent)'s calls (null when none was assigned).
    # Sums add the values in sorted order, so float rounding never depends on DuckDB's scheduling.
    window = "OVER (PARTITION BY c.rollout_id, c.agent_name)"
    if options.reward_policy == "final":  # all calls hold the same value
        traj_reward = f"max(cr.reward) {window}"
    else:
        traj_reward = f"list_sum(list_sort(list(cr.reward) {window}))"
    # call_no: position in the output order; bucket: equal-count ranges of it (builder.stream)
    order = ("group_key, " if options.group_by == "task" else "") + "rollout_id, turn"
    where = ["true"]
    params: dict[str, object] = {}
    if options.agent is not None:
        where.append("regexp_matches(c.agent_name, $agent)")
        params["agent"] = options.agent
    if options.min_policy_version is not None:
        where.append("c.policy_version >= $minpv")
        params["minpv"] = options.min_policy_version
    try:
        con.execute(
            f"""
            CREATE OR REPLACE TEMP TABLE {CHOSEN} AS
            WITH call_reward AS (
                SELECT call_trace_id AS trace_id, call_span_id AS span_id,
                       list_sum(list_sort(list(v))) AS reward
                FROM {assigned} GROUP BY ALL
            ), scored AS (
                SELECT c.*, cr.reward,
                       {traj_reward} AS traj_reward,
                       {group_key} AS group_key
                FROM {calls} c LEFT JOIN call_reward cr USING (trace_id, span_id)
                WHERE c.trainable  -- calls without ids are counted, never written
            )
            SELECT *, CAST((call_no * {buckets}) // count(*) OVER () AS INTEGER) AS bucket
            FROM (SELECT *, row_number() OVER (ORDER BY {order}) - 1 AS call_no
                  FROM scored c WHERE {" AND ".join(where)})""",
            params,
        )
    except duckdb.InvalidInputException as exc:
        raise ValueError(f"invalid --agent regular expression {options.agent!r}: {exc}") from exc
    summary.llm_calls_filtered = (
        summary.llm_calls - summary.llm_calls_without_tokens - scalar(con, f"SELECT count(*) FROM {CHOSEN}")
    )
    return CHOSEN


def drop(con: duckdb.DuckDBPyConnection, *tables: Relation | None) -> None:
    """Drop the tables a later stage no longer reads (their memory goes to the next stages)."""
    for table in tables:
        if table is not None:
            con.execute(f"DROP TABLE IF EXISTS {table}")
