"""Reward assignment policies, in SQL.

Inputs: the calls (distinct LLM calls of the built rollouts: ``trace_id, span_id, rollout_id,
start_time, end_time, response_id, parent, scope, trainable``) and the rewards (``trace_id, span_id,
rollout_id, start_time, end_time, linked_response_id, parent, scope, v`` where ``v`` is the chosen
dimension's value): :func:`tinkertrace.builder.stages.calls` and ``.rewards``.
Output: table ``_assigned(reward_trace_id, reward_span_id, call_trace_id, call_span_id, v)``; a reward
with no row there is unmatched (or superseded under ``final``).

Only trainable calls (``trainable``: prompt and response ids, neither empty) take rewards.

``nearest`` / ``sibling``: walking a rollout's events by time, each reward goes to the newest LLM call
that ended before the reward started and has no reward yet. That greedy walk is parenthesis matching
(a call ending pushes, a reward pops the newest), so it is computed without a loop: a running depth,
clamped at 0 for rewards that find the stack empty, gives every call the depth it pushed to and every
reward the depth it pops from, and a reward matches the latest call before it pushed to that depth
(an ASOF join). ``sibling`` partitions by (rollout, parent span). ``nearest`` respects agent scope:
a reward inside an agent span (``scope``: its nearest enclosing agent span) first walks only that
span's calls (partition by scope); the rewards left then walk the rollout's calls not yet taken.

``link``: a reward naming a ``gen_ai.response.id`` of a call in its rollout goes to that call; the
others fall back to (scoped) ``nearest`` among the calls no link took.

``final``: the rollout's final reward (the latest one flagged final, else the latest one) goes to
every call of the rollout; its other rewards are superseded.

:func:`count_rewards` then counts what the assignment matched, superseded and left unmatched.
"""

from __future__ import annotations

import duckdb

from tinkertrace.builder.options import BuildSettings, RewardPolicy
from tinkertrace.builder.stages import drop, scalar
from tinkertrace.builder.summary import BuildSummary
from tinkertrace.builder.views import Relation

ASSIGNED = "_assigned"


def _stack_match_sql(calls: str, rewards: str, partition: str) -> str:
    """SQL selecting (reward, call) pairs by the nearest-preceding-unrewarded rule within ``partition``."""
    return f"""
    WITH ev AS (
        SELECT rollout_id, {partition} AS part, trace_id, span_id, 0 AS kind, end_time AS t, start_time AS t2
        FROM {calls}
        UNION ALL
        SELECT rollout_id, {partition} AS part, trace_id, span_id, 1 AS kind, start_time AS t, end_time AS t2
        FROM {rewards}
    ), run AS (
        SELECT *, sum(CASE kind WHEN 0 THEN 1 ELSE -1 END) OVER w AS s, row_number() OVER w AS pos
        FROM ev
        WINDOW w AS (PARTITION BY rollout_id, part ORDER BY t, kind, t2, trace_id, span_id
                     ROWS UNBOUNDED PRECEDING)
    ), levels AS (
        -- depth after an event, clamped at 0: s - least(0, running min of s); a call's level is its
        -- depth after, a reward's its depth before (0: nothing to pop, unmatched)
        SELECT *, CASE kind
            WHEN 0 THEN s - least(0, min(s) OVER w)
            ELSE COALESCE(lag(s) OVER w - least(0, min(s) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING
                                                                     AND 1 PRECEDING)), 0)
            END AS level
        FROM run WINDOW w AS (PARTITION BY rollout_id, part ORDER BY pos)
    ), r AS (SELECT * FROM levels WHERE kind = 1 AND level > 0),
    c AS (SELECT * FROM levels WHERE kind = 0)
    SELECT r.trace_id AS reward_trace_id, r.span_id AS reward_span_id,
           c.trace_id AS call_trace_id, c.span_id AS call_span_id
    FROM r ASOF JOIN c ON r.rollout_id = c.rollout_id AND r.part = c.part AND r.level = c.level
                        AND r.pos >= c.pos
    """


def _without(relation: str, pairs: str, side: str) -> str:
    """SQL: the rows of ``relation`` (calls or rewards) that no (reward, call) pair in ``pairs`` took."""
    return (
        f"(SELECT * FROM {relation} ANTI JOIN {pairs} "
        f"ON trace_id = {side}_trace_id AND span_id = {side}_span_id)"
    )


def _scoped_nearest(con: duckdb.DuckDBPyConnection, calls: str, rewards: str, out: str) -> None:
    """Create ``out`` with the ``nearest`` pairs of ``calls`` and ``rewards``: a reward inside an agent
    span (``scope``) first goes to the nearest call of that same agent span; the rewards left (outside
    any agent span, or whose scope has no unrewarded call before them) then go to the nearest call of
    the rollout that is still free."""
    in_scope = _stack_match_sql(
        f"(SELECT * FROM {calls} WHERE scope IS NOT NULL)",
        f"(SELECT * FROM {rewards} WHERE scope IS NOT NULL)",
        "scope",
    )
    con.execute(f"CREATE OR REPLACE TEMP TABLE _in_scope AS {in_scope}")
    rest = _stack_match_sql(
        _without(calls, "_in_scope", "call"), _without(rewards, "_in_scope", "reward"), "''"
    )
    con.execute(f"CREATE OR REPLACE TEMP TABLE {out} AS SELECT * FROM _in_scope UNION ALL ({rest})")
    con.execute("DROP TABLE _in_scope")


def assign_rewards(
    con: duckdb.DuckDBPyConnection, calls: Relation, rewards: Relation, policy: RewardPolicy
) -> Relation:
    """The (reward, call) pairs of ``rewards`` and ``calls`` under ``policy``, with the reward's value.
    Only trainable calls (token ids present) take rewards, so a reward is never counted as matched to
    a call that is not written."""
    all_rewards = rewards
    calls = f"(SELECT * FROM {calls} WHERE trainable)"
    usable = f"(SELECT * FROM {rewards} WHERE v IS NOT NULL)"
    if policy == "final":
        con.execute(f"""
        CREATE OR REPLACE TEMP TABLE {ASSIGNED} AS
        WITH fin AS (
            SELECT * FROM {usable}
            QUALIFY row_number() OVER (PARTITION BY rollout_id
                ORDER BY is_final DESC, start_time DESC, end_time DESC, trace_id DESC, span_id DESC) = 1
        )
        SELECT fin.trace_id AS reward_trace_id, fin.span_id AS reward_span_id,
               c.trace_id AS call_trace_id, c.span_id AS call_span_id, fin.v
        FROM fin JOIN {calls} c USING (rollout_id)
        """)
        return ASSIGNED
    if policy == "link":
        con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _linked AS
        SELECT r.trace_id AS reward_trace_id, r.span_id AS reward_span_id,
               c.trace_id AS call_trace_id, c.span_id AS call_span_id
        FROM {usable} r JOIN {calls} c
          ON c.rollout_id = r.rollout_id AND c.response_id = r.linked_response_id
        """)
        _scoped_nearest(
            con, _without(calls, "_linked", "call"), _without(usable, "_linked", "reward"), "_unlinked"
        )
        pairs = "SELECT * FROM _linked UNION ALL SELECT * FROM _unlinked"
    elif policy == "sibling":
        pairs = _stack_match_sql(calls, usable, "COALESCE(parent, '')")
    else:
        _scoped_nearest(con, calls, usable, "_nearest")
        pairs = "SELECT * FROM _nearest"
    con.execute(f"""
    CREATE OR REPLACE TEMP TABLE {ASSIGNED} AS
    SELECT p.*, r.v FROM ({pairs}) p
    JOIN {all_rewards} r ON r.trace_id = p.reward_trace_id AND r.span_id = p.reward_span_id
    """)
    con.execute("DROP TABLE IF EXISTS _nearest; DROP TABLE IF EXISTS _unlinked; DROP TABLE IF EXISTS _linked")
    return ASSIGNED


def count_rewards(
    con: duckdb.DuckDBPyConnection,
    calls: Relation,
    rewards: Relation,
    assigned: Relation,
    options: BuildSettings,
    summary: BuildSummary,
) -> None:
    """Count the rewards matched to a call, superseded (``final``) or unmatched (listed)."""
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE _reward_state AS
        SELECT w.rollout_id, w.span_id, w.v,
               EXISTS (SELECT 1 FROM {assigned} a WHERE a.reward_trace_id = w.trace_id
                       AND a.reward_span_id = w.span_id) AS matched,
               EXISTS (SELECT 1 FROM {calls} c WHERE c.rollout_id = w.rollout_id AND c.trainable)
                   AS rollout_has_calls
        FROM {rewards} w WHERE w.v IS NOT NULL""")
    summary.rewards_matched = scalar(con, "SELECT count(*) FROM _reward_state WHERE matched")
    unmatched = "NOT matched"
    if options.reward_policy == "final":
        summary.rewards_superseded = scalar(
            con, "SELECT count(*) FROM _reward_state WHERE NOT matched AND rollout_has_calls"
        )
        unmatched = "NOT matched AND NOT rollout_has_calls"
    summary.unmatched_rewards = [
        (r[0], r[1])
        for r in con.execute(
            f"SELECT rollout_id, span_id FROM _reward_state WHERE {unmatched} ORDER BY 1, 2"
        ).fetchall()
    ]
    summary.rewards_unmatched = len(summary.unmatched_rewards)
    drop(con, "_reward_state")
