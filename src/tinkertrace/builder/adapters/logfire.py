"""Logfire (``logfire.instrument_openai``): GenAI parts-form spans, one call possibly as two spans.

Logfire names the span after its message template (``Chat Completion with {request_data[model]!r}``)
and writes the GenAI attributes (:mod:`.genai`). A *streaming* call leaves two spans: the request span
(input only: no output messages, no response id) and a sibling log span ``streaming response from …
took …`` carrying the request's attributes again plus the output and the response id. Only the span
with the output is the call, so 60 calls stay 60 (the request half stays a plain span).
"""

from __future__ import annotations

from tinkertrace import semconv as sc
from tinkertrace.builder.adapters import genai
from tinkertrace.builder.adapters.base import Adapter
from tinkertrace.spanstore.sql import attr

MSG_TEMPLATE = "logfire.msg_template"

ADAPTER = Adapter(
    name="logfire",
    match=f"({attr(MSG_TEMPLATE)} IS NOT NULL AND {genai.IS_LLM})",
    columns={
        "span_type": f"CASE WHEN {attr(sc.GENAI_OUTPUT_MESSAGES)} IS NOT NULL THEN '{sc.TYPE_LLM}' END",
        "model": attr(sc.GENAI_RESPONSE_MODEL),
    },
    conversation=genai.conversation,
    finish_reasons=genai.FINISH_REASONS,
)
