"""The tracing SDK: ``init``, ``@traced_rollout``, ``emit_reward``, ``agent_span``, LLM-call capture.

Modules: ``config`` (options and env vars), ``runtime`` (init/shutdown/flush/stats), ``rollout``
(decorator, rewards, agent spans), ``context`` (context variables, thread propagation),
``spans`` (starts spans with the rollout ids in context), ``capture`` + ``response_parse`` + ``tokens``
(httpx/httpx2 LLM calls), ``export`` (queue and batches), ``sink`` (embedded Parquet),
``otlp`` + ``spool`` (OTLP export that keeps what it cannot send).
"""

from tinkertrace import _SDK_NAMES
from tinkertrace.sdk.context import current_rollout as current_rollout
from tinkertrace.sdk.context import in_context as in_context
from tinkertrace.sdk.rollout import agent_span as agent_span
from tinkertrace.sdk.rollout import emit_reward as emit_reward
from tinkertrace.sdk.rollout import traced_rollout as traced_rollout
from tinkertrace.sdk.runtime import flush as flush
from tinkertrace.sdk.runtime import init as init
from tinkertrace.sdk.runtime import shutdown as shutdown
from tinkertrace.sdk.runtime import stats as stats

__all__ = list(_SDK_NAMES)  # the one list, in ``tinkertrace``, which re-exports these lazily
