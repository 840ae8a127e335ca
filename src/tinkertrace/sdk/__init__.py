"""The tracing SDK: ``init``, ``@traced_rollout``, ``emit_reward``, ``agent_span``, LLM-call capture.

Modules: ``config`` (options and env vars), ``runtime`` (init/shutdown/flush/stats), ``rollout``
(the decorator), ``rewards``, ``agents`` (agent spans), ``context`` (context variables, thread
propagation), ``spans`` (makes spans with the rollout ids in context), ``capture`` (the httpx/httpx2
hook) + ``llm_call`` + ``response_parse`` + ``responses_api`` + ``tokens`` (what an LLM call records),
``export`` (a BatchSpanProcessor per exporter), ``parquet_exporter`` (the embedded sink),
``otlp`` + ``spool`` (OTLP export that keeps what it cannot send).
"""

from tinkertrace.sdk import capture_hooks  # noqa: F401  (it registers the LLM-call capture with the runtime)
from tinkertrace.sdk.agents import agent_span as agent_span
from tinkertrace.sdk.context import current_rollout as current_rollout
from tinkertrace.sdk.context import in_context as in_context
from tinkertrace.sdk.rewards import emit_reward as emit_reward
from tinkertrace.sdk.rollout import traced_rollout as traced_rollout
from tinkertrace.sdk.runtime import flush as flush
from tinkertrace.sdk.runtime import init as init
from tinkertrace.sdk.runtime import shutdown as shutdown
from tinkertrace.sdk.runtime import stats as stats
