"""Agent-lightning's span forms (v0.2–v0.3): LLM spans with int-list token ids, reward spans.

LLM spans are named ``openai.chat.completion`` (also ``litellm_request``, ``raw_gen_ai_request``), with
token ids in ``prompt_token_ids`` / ``response_token_ids`` (int lists) or vLLM's stringified lists and
logprobs as JSON in ``logprobs.content``; rewards are ``agentlightning.annotation`` spans
(``agentlightning.reward.<i>.name/value``, i = 0 primary) or v0.2's ``agentlightning.reward`` with a
float ``reward``. Rollout and attempt ids are resource attributes (read by the ``spans`` view for every
span of such a process: :data:`ROLLOUT_ID`, :data:`ATTEMPT`); these rollouts have no root span with
counts (no completeness record). Agent spans carry ``agent.name``; its OpenAI instrumentation
(OpenLLMetry's) writes each choice's finish reason as ``gen_ai.completion.0.finish_reason``.
"""

from __future__ import annotations

from tinkertrace import semconv as sc
from tinkertrace.builder.adapters.base import Adapter
from tinkertrace.spanstore.sql import attr, attr_json, literal_list

DIMENSIONS = 8  # agentlightning.reward.<i>.* read for i < this

ROLLOUT_ID = attr(sc.AGL_ROLLOUT_ID, "resource_attributes")
ATTEMPT = f"TRY_CAST({attr(sc.AGL_ATTEMPT_ID, 'resource_attributes')} AS INTEGER)"

IS_LLM = f"name IN ({literal_list(sc.AGL_LLM_SPAN_NAMES)})"
IS_REWARD = f"name IN ('{sc.AGL_ANNOTATION_SPAN}', '{sc.AGL_REWARD_SPAN}')"


def reward_name(i: int) -> str:
    """SQL: the name of reward dimension ``i`` of an annotation span."""
    return attr(sc.AGL_REWARD_NAME_FMT.format(i=i))


def reward_value(i: int) -> str:
    """SQL: the value of reward dimension ``i`` of an annotation span."""
    return f"TRY_CAST({attr(sc.AGL_REWARD_VALUE_FMT.format(i=i))} AS DOUBLE)"


def dimensions_sql() -> str:
    """SQL: MAP(name -> value) of an annotation span's reward dimensions."""
    entries = ", ".join(f"{{'k': {reward_name(i)}, 'v': {reward_value(i)}}}" for i in range(DIMENSIONS))
    return f"map_from_entries(list_filter([{entries}], lambda e: e.k IS NOT NULL AND e.v IS NOT NULL))"


PROMPT_IDS = (
    f"COALESCE(TRY_CAST({attr_json(sc.AGL_PROMPT_TOKEN_IDS)} AS INTEGER[]), "
    f"TRY_CAST({attr(sc.AGL_VLLM_PROMPT_TOKEN_IDS)} AS INTEGER[]))"
)
RESPONSE_IDS = (
    f"COALESCE(TRY_CAST({attr_json(sc.AGL_RESPONSE_TOKEN_IDS)} AS INTEGER[]), "
    f"TRY_CAST({attr(sc.AGL_VLLM_RESPONSE_TOKEN_IDS)} AS INTEGER[]))"
)
LOGPROBS = (
    f"CASE WHEN json_valid({attr(sc.AGL_LOGPROBS_CONTENT)}) THEN "
    f"TRY_CAST(json_extract({attr(sc.AGL_LOGPROBS_CONTENT)}, '$[*].logprob') AS FLOAT[]) END"
)
_VALUE = f"COALESCE({reward_value(0)}, TRY_CAST({attr('reward')} AS DOUBLE))"

ADAPTER = Adapter(
    name="agentlightning",
    match=f"({IS_LLM} OR {IS_REWARD})",
    columns={
        "span_type": f"CASE WHEN {IS_LLM} THEN '{sc.TYPE_LLM}' ELSE '{sc.TYPE_REWARD}' END",
        "prompt_token_ids": f"CASE WHEN {IS_LLM} THEN {PROMPT_IDS} END",
        "response_token_ids": f"CASE WHEN {IS_LLM} THEN {RESPONSE_IDS} END",
        "response_logprobs": f"CASE WHEN {IS_LLM} THEN {LOGPROBS} END",
        "reward_name": (
            f"CASE WHEN {_VALUE} IS NOT NULL THEN COALESCE({reward_name(0)}, '{sc.PRIMARY_REWARD}') END"
        ),
        "reward_value": _VALUE,
    },
    finish_reasons=(attr(sc.AGL_FINISH_REASON),),
    dimensions=dimensions_sql(),
    rollout_id=ROLLOUT_ID,
    attempt=ATTEMPT,
    completeness_record=False,
    agent_name=attr(sc.FOREIGN_AGENT_NAME),
)
