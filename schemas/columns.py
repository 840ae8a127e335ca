"""Column names of the ``spans`` table that code refers to, and which span attribute fills which column.

The types are the JSON definition's (``spans.v*.json``); this module names the groups of columns that
writers and readers treat alike, and maps OTLP attribute keys (``semconv``) to the columns they are
lifted into. Every attribute not named here stays in the ``attributes`` JSON column.
"""

from __future__ import annotations

from typing import Final

from tinkertrace import semconv

# token lists: packed little-endian values on the wire, list<int32>/list<float32> in the table
TOKEN_COLUMNS: Final = ("prompt_token_ids", "response_token_ids", "response_logprobs")
# JSON text columns (never used to prune row groups)
JSON_COLUMNS: Final = ("attributes", "resource_attributes", "events", "links")

# span attribute key -> the scalar column it is lifted into (coerced to the column's type; a value
# that does not fit stays in the JSON attributes)
SCALAR_ATTRIBUTES: Final[dict[str, str]] = {
    semconv.SPAN_TYPE: "span_type",
    semconv.ROLLOUT_ID: "rollout_id",
    semconv.TASK_ID: "task_id",
    semconv.ATTEMPT: "attempt",
    semconv.SPLIT: "split",
    semconv.AGENT_NAME: "agent_name",
    semconv.GENAI_REQUEST_MODEL: "model",
    semconv.GENAI_RESPONSE_ID: "response_id",
    semconv.REWARD_NAME: "reward_name",
    semconv.REWARD_VALUE: "reward_value",
    semconv.TOKEN_SOURCE: "token_source",
    semconv.POLICY_VERSION: "policy_version",
}
# span attribute key -> the token column it is lifted into (a value that is not a token array rejects
# the span)
TOKEN_ATTRIBUTES: Final[dict[str, str]] = {
    semconv.PROMPT_TOKEN_IDS: "prompt_token_ids",
    semconv.RESPONSE_TOKEN_IDS: "response_token_ids",
    semconv.RESPONSE_LOGPROBS: "response_logprobs",
}
# Other producers' keys for the same token columns (Agent-lightning's int lists): lifted the same way
# when a span lacks ours (ours win), kept in the JSON attributes when they are not token arrays.
TOKEN_ALIASES: Final[dict[str, str]] = {
    semconv.AGL_PROMPT_TOKEN_IDS: semconv.PROMPT_TOKEN_IDS,
    semconv.AGL_RESPONSE_TOKEN_IDS: semconv.RESPONSE_TOKEN_IDS,
}
