"""DuckDB views over a spans folder: ``spans``, ``llm_calls``, ``rewards`` and ``rollouts``.

``spans`` is the raw span table normalised so that Agent-lightning's span forms look like ours: its
LLM spans (``openai.chat.completion`` ...) become ``span_type = 'llm'`` with token ids and logprobs
pulled out of the JSON attributes, its reward spans (``agentlightning.annotation``,
``agentlightning.reward``, AgentOps ``{"type": "reward"}`` outputs) become ``span_type = 'reward'``,
and its resource attribute ``agentlightning.rollout_id`` fills ``rollout_id``. Spans that carry no
rollout id inherit the one of the rollout root span in their trace. ``agent_span_name`` is the agent
name of agent spans (ours, GenAI ``invoke_agent``, or ``agent.name`` as Agent-lightning, OpenInference
and AgentOps write it), null on other spans.

The other three views are defined over any relation with the ``spans`` columns, so the builder can
run them over a materialised, token-free copy (:func:`create_derived_views` with ``source``).
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from tinkertrace import semconv as sc
from tinkertrace.spanstore.reader import ReadReport, open_spans

RAW_VIEW = "spans_raw"

# JSON paths into the attributes / resource_attributes text columns.
_A = "attributes"


def _attr(name: str) -> str:
    """SQL: the JSON value of attribute ``name`` as text (null when absent)."""
    return f"json_extract_string({_A}, '$.\"{name}\"')"


def _attr_json(name: str) -> str:
    return f"json_extract({_A}, '$.\"{name}\"')"


_AGL_LLM = ", ".join(f"'{n}'" for n in sc.AGL_LLM_SPAN_NAMES)
_AGENTOPS = ("agentops.task.output", "agentops.entity.output")
_AGL_DIMENSIONS = 8  # agentlightning.reward.<i>.* read for i < this


def _agentops_reward_value() -> str:
    """SQL: the value of an AgentOps ``{"type": "reward", "value": x}`` output attribute, else null."""
    parts = []
    for key in _AGENTOPS:
        text = _attr(key)
        parts.append(
            f"CASE WHEN json_valid({text}) AND json_extract_string({text}, '$.type') = 'reward' "
            f"THEN TRY_CAST(json_extract_string({text}, '$.value') AS DOUBLE) END"
        )
    return f"COALESCE({', '.join(parts)})"


def _agl_name(i: int) -> str:
    return _attr(sc.AGL_REWARD_NAME_FMT.format(i=i))


def _agl_value(i: int) -> str:
    return f"TRY_CAST({_attr(sc.AGL_REWARD_VALUE_FMT.format(i=i))} AS DOUBLE)"


def _agl_token_sql() -> tuple[str, str, str]:
    """SQL reading Agent-lightning's prompt ids, response ids and logprobs from the attributes."""
    prompt_ids = (
        f"COALESCE(TRY_CAST({_attr_json(sc.AGL_PROMPT_TOKEN_IDS)} AS INTEGER[]), "
        f"TRY_CAST({_attr(sc.AGL_VLLM_PROMPT_TOKEN_IDS)} AS INTEGER[]))"
    )
    response_ids = (
        f"COALESCE(TRY_CAST({_attr_json(sc.AGL_RESPONSE_TOKEN_IDS)} AS INTEGER[]), "
        f"TRY_CAST({_attr(sc.AGL_VLLM_RESPONSE_TOKEN_IDS)} AS INTEGER[]))"
    )
    logprobs = (
        f"CASE WHEN json_valid({_attr(sc.AGL_LOGPROBS_CONTENT)}) THEN "
        f"TRY_CAST(json_extract({_attr(sc.AGL_LOGPROBS_CONTENT)}, '$[*].logprob') AS FLOAT[]) END"
    )
    return prompt_ids, response_ids, logprobs


def span_tokens_sql() -> str:
    """Token columns of LLM spans (ours or Agent-lightning's), keyed by (trace_id, span_id, filename):
    what the builder joins its chosen calls with, without the rest of the ``spans`` view's work."""
    prompt_ids, response_ids, logprobs = _agl_token_sql()
    agl = f"span_type IS NULL AND name IN ({_AGL_LLM})"
    return f"""
    SELECT trace_id, span_id, filename,
           COALESCE(prompt_token_ids, CASE WHEN {agl} THEN {prompt_ids} END) AS prompt_token_ids,
           COALESCE(response_token_ids, CASE WHEN {agl} THEN {response_ids} END) AS response_token_ids,
           COALESCE(response_logprobs, CASE WHEN {agl} THEN {logprobs} END) AS response_logprobs
    FROM {RAW_VIEW} WHERE span_type = '{sc.TYPE_LLM}' OR ({agl})
    """


def _agent_span_name_sql() -> str:
    """SQL (over the raw row ``r``): the agent name of an agent span, else null. Agent spans are ours
    (``span_type = 'agent'``), the GenAI convention's ``invoke_agent`` spans (name in
    ``gen_ai.agent.name``, else in the span name ``invoke_agent {name}``) and spans carrying
    ``agent.name`` (Agent-lightning, OpenInference, AgentOps)."""
    invoke = f"{_attr(sc.GENAI_OPERATION)} = '{sc.AGENT_OPERATION}'"
    named = f"NULLIF(regexp_extract(r.name, '^{sc.AGENT_OPERATION} (.+)$', 1), '')"
    return f"""CASE WHEN r.span_type = '{sc.TYPE_AGENT}' THEN r.agent_name
        WHEN r.span_type IS NULL THEN COALESCE({_attr(sc.FOREIGN_AGENT_NAME)},
            CASE WHEN {invoke} THEN COALESCE(r.agent_name, {named}) END) END"""


def _spans_sql() -> str:
    prompt_ids, response_ids, logprobs = _agl_token_sql()
    is_agl_llm = f"name IN ({_AGL_LLM})"
    is_agl_reward = f"name IN ('{sc.AGL_ANNOTATION_SPAN}', '{sc.AGL_REWARD_SPAN}')"
    agl_rollout = f"json_extract_string(resource_attributes, '$.\"{sc.AGL_ROLLOUT_ID}\"')"
    agl_attempt = (
        f"TRY_CAST(json_extract_string(resource_attributes, '$.\"{sc.AGL_ATTEMPT_ID}\"') AS INTEGER)"
    )
    agl_value = (
        f"COALESCE({_agl_value(0)}, TRY_CAST({_attr('reward')} AS DOUBLE), {_agentops_reward_value()})"
    )
    # Only rows without our span_type pay for the JSON work (CASE evaluates branches lazily).
    foreign = "r.span_type IS NULL"
    return f"""
    WITH roots AS (
        SELECT trace_id, min(rollout_id) AS rollout_id FROM {RAW_VIEW}
        WHERE span_type = '{sc.TYPE_ROLLOUT}' AND rollout_id IS NOT NULL GROUP BY trace_id
    ), typed AS (
        SELECT r.* REPLACE (
            COALESCE(r.span_type, CASE
                WHEN {is_agl_llm} THEN '{sc.TYPE_LLM}'
                WHEN {is_agl_reward} THEN '{sc.TYPE_REWARD}'
                WHEN {_agentops_reward_value()} IS NOT NULL THEN '{sc.TYPE_REWARD}' END) AS span_type,
            COALESCE(r.rollout_id, CASE WHEN {foreign} THEN {agl_rollout} END, roots.rollout_id)
                AS rollout_id,
            COALESCE(r.attempt, CASE WHEN {foreign} THEN {agl_attempt} END) AS attempt,
            COALESCE(r.prompt_token_ids, CASE WHEN {foreign} AND {is_agl_llm} THEN {prompt_ids} END)
                AS prompt_token_ids,
            COALESCE(r.response_token_ids, CASE WHEN {foreign} AND {is_agl_llm} THEN {response_ids} END)
                AS response_token_ids,
            COALESCE(r.response_logprobs, CASE WHEN {foreign} AND {is_agl_llm} THEN {logprobs} END)
                AS response_logprobs,
            COALESCE(r.reward_name, CASE WHEN {foreign} AND {agl_value} IS NOT NULL
                THEN COALESCE({_agl_name(0)}, '{sc.PRIMARY_REWARD}') END) AS reward_name,
            COALESCE(r.reward_value, CASE WHEN {foreign} THEN {agl_value} END) AS reward_value
        ),
        r.span_type IS NULL AND {agl_rollout} IS NOT NULL AS from_agentlightning,
        {_agent_span_name_sql()} AS agent_span_name
        FROM {RAW_VIEW} r LEFT JOIN roots ON roots.trace_id = r.trace_id
    )
    SELECT * FROM typed
    """


def _dimensions_sql() -> str:
    """SQL: MAP(name -> value) of a reward span's dimensions (ours or Agent-lightning's)."""
    # the SDK stores the dimensions as JSON text; accept a JSON object too
    ours = f"TRY_CAST(TRY_CAST({_attr(sc.REWARD_DIMENSIONS)} AS JSON) AS MAP(VARCHAR, DOUBLE))"
    entries = ", ".join(f"{{'k': {_agl_name(i)}, 'v': {_agl_value(i)}}}" for i in range(_AGL_DIMENSIONS))
    agl = f"map_from_entries(list_filter([{entries}], lambda e: e.k IS NOT NULL AND e.v IS NOT NULL))"
    return (
        f"COALESCE({ours}, CASE WHEN from_agentlightning OR name = '{sc.AGL_ANNOTATION_SPAN}' THEN {agl} END)"
    )


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
    (the GenAI list ``gen_ai.response.finish_reasons``, or openllmetry's
    ``gen_ai.completion.0.finish_reason``) or a stream the agent closed before its end
    (``tinkertrace.llm.closed_early``). Null on other spans."""
    reasons = _attr_json(sc.GENAI_FINISH_REASONS)
    cut = ", ".join(f"'{r}'" for r in TRUNCATION_REASONS)
    length = (
        f"(list_has_any(TRY_CAST({reasons} AS VARCHAR[]), [{cut}]) "
        f"OR {_attr(sc.GENAI_FINISH_REASONS)} IN ({cut}) OR {_attr(sc.AGL_FINISH_REASON)} IN ({cut}))"
    )
    closed = f"TRY_CAST({_attr(sc.LLM_CLOSED_EARLY)} AS BOOLEAN)"
    # only spans whose attributes mention either key pay for the JSON parsing
    mentioned = "(contains(attributes, 'finish_reason') OR contains(attributes, 'closed_early'))"
    return f"""CASE WHEN span_type = '{sc.TYPE_LLM}' THEN
        COALESCE(CASE WHEN {mentioned} THEN COALESCE({length}, false) OR COALESCE({closed}, false) END,
                 false) END"""


def llm_calls_sql(source: str) -> str:
    """One row per distinct LLM call: nested spans of the same call dropped, duplicates by response id."""
    return f"""
    WITH llm AS (SELECT * FROM {source} WHERE span_type = '{sc.TYPE_LLM}'),
    marked AS (
        SELECT l.*, (p.span_id IS NOT NULL AND (p.response_id IS NULL OR l.response_id IS NULL
                     OR p.response_id = l.response_id)) AS nested_in_same_call
        FROM llm l LEFT JOIN (SELECT DISTINCT trace_id, span_id, response_id FROM llm) p
          ON p.trace_id = l.trace_id AND p.span_id = l.parent_span_id
    )
    SELECT * EXCLUDE (nested_in_same_call) FROM marked WHERE NOT nested_in_same_call
    QUALIFY row_number() OVER (
        PARTITION BY rollout_id, COALESCE(response_id, trace_id || span_id)
        ORDER BY start_time, end_time DESC, span_id, received_at, filename) = 1
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
    """One row per rollout id: root fields, span counts and completeness (``incomplete_reason``)."""
    return f"""
    WITH u AS (
        SELECT * FROM {source} WHERE rollout_id IS NOT NULL
        QUALIFY row_number() OVER (PARTITION BY trace_id, span_id ORDER BY received_at) = 1
    ), root AS (
        SELECT rollout_id, span_id AS root_span_id, start_time, end_time, task_id, attempt, split,
               {_attr(sc.ROLLOUT_STATUS)} AS status,
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
               bool_and(from_agentlightning) AS agentlightning
        FROM u GROUP BY rollout_id
    )
    SELECT s.rollout_id,
           COALESCE(root.task_id, s.any_task) AS task_id,
           COALESCE(root.attempt, s.any_attempt) AS attempt,
           COALESCE(root.split, s.any_split) AS split,
           COALESCE(root.start_time, s.first_start) AS start_time,
           COALESCE(root.end_time, s.last_end) AS end_time,
           root.status, root.root_span_id, root.expected_llm_calls, root.expected_rewards,
           s.spans, s.llm_spans, s.reward_spans, s.agentlightning,
           CASE WHEN s.agentlightning THEN NULL
                WHEN root.rollout_id IS NULL THEN 'root_missing'
                WHEN s.llm_spans < COALESCE(root.expected_llm_calls, 0) THEN 'missing_llm_spans'
                WHEN s.reward_spans < COALESCE(root.expected_rewards, 0) THEN 'missing_reward_spans'
           END AS incomplete_reason
    FROM stats s LEFT JOIN root USING (rollout_id)
    """


def create_spans_view(con: duckdb.DuckDBPyConnection, *, name: str = "spans") -> None:
    """Create the normalised ``spans`` view over the raw view ``spans_raw``."""
    con.execute(f"CREATE OR REPLACE VIEW {name} AS {_spans_sql()}")


def create_derived_views(con: duckdb.DuckDBPyConnection, source: str = "spans") -> None:
    """Create ``llm_calls``, ``rewards`` and ``rollouts`` over ``source`` (a relation with span columns)."""
    con.execute(f"CREATE OR REPLACE VIEW llm_calls AS {llm_calls_sql(source)}")
    con.execute(f"CREATE OR REPLACE VIEW rewards AS {rewards_sql(source)}")
    con.execute(f"CREATE OR REPLACE VIEW rollouts AS {rollouts_sql(source)}")


def open_views(
    con: duckdb.DuckDBPyConnection, spans_dir: Path, files: tuple[Path, ...] | None = None
) -> ReadReport:
    """Open ``spans_dir`` (or just ``files``) and create all four views; returns the reader's report."""
    report = open_raw(con, spans_dir, files)
    create_spans_view(con)
    create_derived_views(con)
    return report


def open_raw(
    con: duckdb.DuckDBPyConnection, spans_dir: Path, files: tuple[Path, ...] | None = None
) -> ReadReport:
    """Create the raw view ``spans_raw`` over the valid span files under ``spans_dir`` (corrupt ones
    skipped and reported), restricted to ``files`` when given."""
    report = open_spans(con, spans_dir, view=RAW_VIEW + "_all")
    if files is None:
        con.execute(f"CREATE OR REPLACE VIEW {RAW_VIEW} AS SELECT * FROM {RAW_VIEW}_all")
        return report
    wanted = {Path(f).resolve() for f in files}
    kept = [f for f in report.files if f.resolve() in wanted]
    skipped = [(f, why) for f, why in report.skipped if f.resolve() in wanted]
    listing = ", ".join("'" + str(f).replace("'", "''") + "'" for f in kept) or "NULL"
    # A literal IN list lets DuckDB skip the other files at scan time.
    con.execute(
        f"CREATE OR REPLACE VIEW {RAW_VIEW} AS SELECT * FROM {RAW_VIEW}_all WHERE filename IN ({listing})"
    )
    return ReadReport(files=kept, skipped=skipped)
