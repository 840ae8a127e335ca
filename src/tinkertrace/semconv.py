"""The span contract: attribute names and values shared by the SDK, the collector and the builder.

LLM spans follow the OpenTelemetry GenAI conventions (``gen_ai.*``); what those conventions do not
define (token ids, logprobs, rollout bookkeeping) lives in the ``tinkertrace.*`` namespace.
Agent-lightning's names are listed at the end so the builder can read its users' data.
"""

from typing import Final

# --- span types (value of SPAN_TYPE) ------------------------------------------------------------
SPAN_TYPE: Final = "tinkertrace.span_type"
TYPE_ROLLOUT: Final = "rollout"
TYPE_LLM: Final = "llm"
TYPE_REWARD: Final = "reward"
TYPE_AGENT: Final = "agent"

# --- copied from context onto every span at start (see sdk.spans) ----------------------------
ROLLOUT_ID: Final = "tinkertrace.rollout.id"
TASK_ID: Final = "tinkertrace.task.id"
ATTEMPT: Final = "tinkertrace.rollout.attempt"
SPLIT: Final = "tinkertrace.rollout.split"
AGENT_NAME: Final = "gen_ai.agent.name"

# --- rollout (root) span ----------------------------------------------------------------------------
TASK_INPUT: Final = "tinkertrace.task.input"  # JSON text
ROLLOUT_STATUS: Final = "tinkertrace.rollout.status"  # "succeeded" | "failed" | "timed_out"
ROLLOUT_LLM_CALLS: Final = "tinkertrace.rollout.llm_calls"  # LLM spans the rollout made
ROLLOUT_REWARDS: Final = "tinkertrace.rollout.rewards"  # reward spans the rollout made
ROLLOUT_AGENT_SPANS: Final = "tinkertrace.rollout.agent_spans"  # agent spans the rollout made
STATUS_SUCCEEDED: Final = "succeeded"
STATUS_FAILED: Final = "failed"
STATUS_TIMED_OUT: Final = "timed_out"  # closed by the endpoint after its idle time (never finished)

# --- LLM call span (GenAI conventions) -------------------------------------------------------------
GENAI_OPERATION: Final = "gen_ai.operation.name"  # "chat" | "text_completion"
GENAI_PROVIDER: Final = "gen_ai.provider.name"
GENAI_REQUEST_MODEL: Final = "gen_ai.request.model"
GENAI_RESPONSE_MODEL: Final = "gen_ai.response.model"
GENAI_RESPONSE_ID: Final = "gen_ai.response.id"
GENAI_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
GENAI_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GENAI_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GENAI_TEMPERATURE: Final = "gen_ai.request.temperature"
GENAI_TOP_P: Final = "gen_ai.request.top_p"
GENAI_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
GENAI_STOP: Final = "gen_ai.request.stop_sequences"
GENAI_INPUT_MESSAGES: Final = "gen_ai.input.messages"  # JSON text, when content capture is on
GENAI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"  # JSON text, when content capture is on

# --- RL data on LLM spans ---------------------------------------------------------------------------
PROMPT_TOKEN_IDS: Final = "tinkertrace.llm.prompt_token_ids"
RESPONSE_TOKEN_IDS: Final = "tinkertrace.llm.response_token_ids"
RESPONSE_LOGPROBS: Final = "tinkertrace.llm.response_logprobs"
TOKEN_ENCODING: Final = "tinkertrace.llm.token_encoding"
# Token ids as little-endian int32 bytes, logprobs as little-endian float32 bytes.
ENCODING_PACKED: Final = "packed-le32"
# Plain OTel int/float array attributes (accepted from other producers).
ENCODING_ARRAY: Final = "array"
TOKEN_SOURCE: Final = "tinkertrace.llm.token_source"
SOURCE_SERVER: Final = "server"  # ids returned by the sampling server: exactly what was sampled
SOURCE_RETOKENIZED: Final = "retokenized"  # ids rebuilt from text by a local tokenizer: may drift
POLICY_VERSION: Final = "tinkertrace.policy.version"
# The policy version of each response token, as runs: flat [version, count, version, count, ...] pairs
# over the response tokens in order (counts sum to their number). Absent when the producer does not know;
# POLICY_VERSION is then the version of the first response token.
POLICY_VERSION_RUNS: Final = "tinkertrace.policy.version_runs"

# --- reward span (mirrors gen_ai.evaluation.result) ------------------------------------------------
REWARD_SPAN_NAME: Final = "gen_ai.evaluation.result"
GENAI_EVALUATION_NAME: Final = "gen_ai.evaluation.name"
GENAI_EVALUATION_SCORE: Final = "gen_ai.evaluation.score.value"
REWARD_NAME: Final = "tinkertrace.reward.name"  # the primary dimension's name
REWARD_VALUE: Final = "tinkertrace.reward.value"  # the primary dimension's value
REWARD_DIMENSIONS: Final = "tinkertrace.reward.dimensions"  # JSON {name: value} of all dimensions
REWARD_FINAL: Final = "tinkertrace.reward.final"  # True for the value a rollout function returned
PRIMARY_REWARD: Final = "primary"
# A reward may name the call it rewards with GENAI_RESPONSE_ID.

# --- agent span ---------------------------------------------------------------------------------------
AGENT_OPERATION: Final = "invoke_agent"  # span name "invoke_agent {name}", gen_ai.operation.name
# On every span started inside an agent span (LLM calls and rewards included): the span id (16 hex
# digits, as the span_id column) of the nearest enclosing agent span, the scope of its rewards.
AGENT_SPAN_ID: Final = "tinkertrace.agent.span_id"

# --- sampling endpoint extensions (OpenAI-compatible responses) ------------------------------------
# Request fields that ask a vLLM-style server for ids and logprobs; response fields it answers with.
REQUEST_RETURN_TOKEN_IDS: Final = "return_token_ids"
RESPONSE_PROMPT_TOKEN_IDS: Final = "prompt_token_ids"
RESPONSE_CHOICE_TOKEN_IDS: Final = "token_ids"
RESPONSE_POLICY_VERSION: Final = "policy_version"
RESPONSE_POLICY_VERSION_RUNS: Final = "policy_version_runs"  # on a choice (its tokens) and the envelope
HEADER_POLICY_VERSION: Final = "x-tinkertrace-policy-version"
# Sent by the SDK with every LLM call inside a rollout: the endpoint admits new rollouts by it.
HEADER_ROLLOUT_ID: Final = "x-tinkertrace-rollout-id"
# Sent with it (by the SDK, or set by hand / a URL prefix): the rest of the call's identity, which a
# recording endpoint or proxy copies onto the LLM spans it records.
HEADER_TASK_ID: Final = "x-tinkertrace-task-id"
HEADER_ATTEMPT: Final = "x-tinkertrace-attempt"
HEADER_SPLIT: Final = "x-tinkertrace-split"
HEADER_AGENT_NAME: Final = "x-tinkertrace-agent-name"
# The same extension on the Responses API (/v1/responses): the request asks with REQUEST_RETURN_TOKEN_IDS
# (logprobs with include=["message.output_text.logprobs"]); the Response object (non-streaming, and the
# `response` of the `response.completed` stream event) carries these top-level fields. Output ids are every
# sampled token, tool-call tokens included; the logprobs are aligned with them.
RESPONSES_PROMPT_TOKEN_IDS: Final = "prompt_token_ids"
RESPONSES_OUTPUT_TOKEN_IDS: Final = "output_token_ids"
RESPONSES_OUTPUT_LOGPROBS: Final = "output_token_logprobs"
# The `include` value by which a Responses request asks for output_text logprobs (OpenAI's name).
RESPONSES_INCLUDE_LOGPROBS: Final = "message.output_text.logprobs"

# --- Agent-lightning span forms (v0.2–v0.3), read by the builder ------------------------------------
AGL_ANNOTATION_SPAN: Final = "agentlightning.annotation"
AGL_REWARD_SPAN: Final = "agentlightning.reward"
AGL_REWARD_NAME_FMT: Final = "agentlightning.reward.{i}.name"
AGL_REWARD_VALUE_FMT: Final = "agentlightning.reward.{i}.value"
AGL_LLM_SPAN_NAMES: Final = ("openai.chat.completion", "litellm_request", "raw_gen_ai_request")
AGL_PROMPT_TOKEN_IDS: Final = "prompt_token_ids"
AGL_RESPONSE_TOKEN_IDS: Final = "response_token_ids"
AGL_VLLM_PROMPT_TOKEN_IDS: Final = "llm.hosted_vllm.prompt_token_ids"
AGL_VLLM_RESPONSE_TOKEN_IDS: Final = "llm.hosted_vllm.response_token_ids"
AGL_LOGPROBS_CONTENT: Final = "logprobs.content"
AGL_ROLLOUT_ID: Final = "agentlightning.rollout_id"  # resource attribute
AGL_ATTEMPT_ID: Final = "agentlightning.attempt_id"  # resource attribute
# The agent name other producers put on their agent spans (Agent-lightning, OpenInference, AgentOps).
FOREIGN_AGENT_NAME: Final = "agent.name"
# openllmetry's per-choice finish reason on LLM spans (Agent-lightning's OpenAI instrumentation).
AGL_FINISH_REASON: Final = "gen_ai.completion.0.finish_reason"

# --- SDK (H2): extra attributes the SDK writes on LLM spans -----------------------------------------
SOURCE_NONE: Final = "none"  # TOKEN_SOURCE when no ids were returned and no tokenizer was configured
LLM_STREAMING: Final = "tinkertrace.llm.streaming"  # bool: the call streamed its response (SSE)
LLM_INJECTED: Final = "tinkertrace.llm.injected"  # request fields the SDK added (e.g. return_token_ids)
LLM_CHOICES: Final = "tinkertrace.llm.choices"  # number of choices; RL data is from choice 0
LLM_CLOSED_EARLY: Final = "tinkertrace.llm.closed_early"  # the agent closed the stream before its end
LLM_CAPTURE_ERROR: Final = "tinkertrace.llm.capture_error"  # why the response could not be read

# --- capture side: who recorded an LLM span ----------------------------------------------------------
# The SDK records calls on the client side; the sampling endpoint and `tinkertrace proxy` record the calls
# they serve on the server side. A call seen by both (same gen_ai.response.id) builds one triplet.
LLM_CAPTURE_SIDE: Final = "tinkertrace.llm.capture_side"
CAPTURE_CLIENT: Final = "client"
CAPTURE_SERVER: Final = "server"
