"""The tracing SDK: ``init``, ``@traced_rollout``, ``emit_reward``, ``agent_span``, LLM-call capture.

Modules: ``config`` (options and env vars), ``runtime`` (init/shutdown/flush/stats), ``rollout``
(decorator, rewards, agent spans), ``context`` (context variables, thread propagation),
``spans`` (starts spans with the rollout ids in context), ``capture`` + ``response_parse`` + ``tokens``
(httpx/httpx2 LLM calls), ``export`` (queue and batches), ``sink`` (embedded Parquet),
``otlp`` + ``spool`` (OTLP export that keeps what it cannot send).
"""

from tinkertrace.sdk.context import current_rollout, in_context
from tinkertrace.sdk.rollout import agent_span, emit_reward, traced_rollout
from tinkertrace.sdk.runtime import flush, init, shutdown, stats

__all__ = [
    "agent_span",
    "current_rollout",
    "emit_reward",
    "flush",
    "in_context",
    "init",
    "shutdown",
    "stats",
    "traced_rollout",
]
