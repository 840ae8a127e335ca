"""Token ids for calls whose producer stored text only: the served model's chat template, at build time.

OpenLLMetry, the official GenAI instrumentation and Logfire record messages but no token ids. With a
tokenizer (``build-trajectories --tokenizer NAME_OR_FOLDER``: the model the endpoint served), each such
call's messages and tools (:class:`~tinkertrace.builder.adapters.Conversation`, from its adapter) are
rendered with the tokenizer's chat template: the prompt ids are the conversation with the generation
prompt, the response ids what the full conversation adds after it, up to and including the end-of-turn
token. They are marked ``token_source = retokenized``: text re-tokenised may differ from what was
sampled (a tool call re-serialised, a template that is not the server's), so training and the summary
can tell them from the server's exact ids.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import duckdb
import pyarrow as pa

from tinkertrace import semconv as sc
from tinkertrace.builder.adapters import ADAPTERS
from tinkertrace.builder.adapters.genai import MESSAGE_EVENT_NAMES, MESSAGE_EVENTS
from tinkertrace.builder.summary import NO_TOKENIZER_REASON
from tinkertrace.builder.views import Relation, typed_sql
from tinkertrace.spanstore.sql import literal_list

TABLE = "_retokenized"
# why a call without token ids could not be rebuilt (BuildSummary.llm_calls_not_rebuilt)
NO_TOKENIZER = NO_TOKENIZER_REASON
NO_MESSAGES = "no ids and no message content recorded"
TEMPLATE_FAILED = "chat template failed on the messages"


def text_only_calls_sql(raw: Relation, logs: Relation) -> str:
    """SQL: LLM spans of ``raw`` (mapped by their adapters:
    :func:`~tinkertrace.builder.views.typed_sql`) from producers that can give their messages, without
    token ids of their own; their attributes completed by their GenAI event log records in ``logs``.
    The official instrumentation in ``event_only`` mode sends the messages as one log record of the
    call's span (its attributes merged in; the span's own win); in its default mode, one record per
    message and per choice (the list of ``{name, body}`` in emission order under
    ``genai.MESSAGE_EVENTS``)."""
    producers = ", ".join(f"'{a.name}'" for a in ADAPTERS if a.conversation is not None)
    return f"""
    WITH calls AS (
        SELECT DISTINCT ON (trace_id, span_id) trace_id, span_id, producer, attributes
        FROM ({typed_sql(raw)}) WHERE span_type = '{sc.TYPE_LLM}' AND producer IN ({producers})
          AND (prompt_token_ids IS NULL OR response_token_ids IS NULL)
    ), details AS (
        SELECT trace_id, span_id, list(attributes ORDER BY time, received_at) AS records FROM {logs}
        WHERE span_id IS NOT NULL AND contains(attributes, '{sc.GENAI_INPUT_MESSAGES}')
        GROUP BY ALL
    ), messages AS (
        SELECT trace_id, span_id,
               json_object('{MESSAGE_EVENTS}', to_json(list({{'name': event_name, 'body': body}}
                   ORDER BY COALESCE(time, observed_time), observed_time, received_at))) AS events
        FROM {logs} WHERE span_id IS NOT NULL AND event_name IN ({literal_list(MESSAGE_EVENT_NAMES)})
        GROUP BY ALL
    )
    SELECT c.trace_id, c.span_id, c.producer,
           CASE WHEN d.records IS NULL AND m.events IS NULL THEN c.attributes
                ELSE CAST(json_merge_patch(COALESCE(d.records[1], '{{}}'), COALESCE(m.events, '{{}}'),
                                           c.attributes) AS VARCHAR) END AS attributes
    FROM calls c LEFT JOIN details d USING (trace_id, span_id)
    LEFT JOIN messages m USING (trace_id, span_id)
    """


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, generation: bool) -> list[int]:
    text = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=generation, tokenize=False
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


def call_ids(tokenizer: Any, conversation: Any) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) of one call rendered with ``tokenizer``'s chat template."""
    prompt = _render(tokenizer, conversation.messages, conversation.tools, True)
    full = _render(tokenizer, [*conversation.messages, conversation.output], conversation.tools, False)
    if full[: len(prompt)] == prompt:
        response = full[len(prompt) :]
    else:  # a template that renders the last turn differently: the answer's text alone
        response = list(tokenizer.encode(conversation.output.get("content") or "", add_special_tokens=False))
        response.append(tokenizer.eos_token_id)
    eos = tokenizer.eos_token_id
    if eos in response:  # the sampled turn ends at the end-of-turn token; what follows is the template's
        response = response[: response.index(eos) + 1]
    return prompt, response


def retokenize(
    con: duckdb.DuckDBPyConnection, raw: Relation, logs: Relation, tokenizer: Any | None
) -> tuple[Relation | None, Counter[str]]:
    """Rebuild the token ids of the text-only calls of the span rows ``raw`` (their content completed
    by ``logs``) into table :data:`TABLE` (``trace_id, span_id, prompt_token_ids, response_token_ids,
    response_logprobs, token_source``, which the ``spans_typed`` view joins in:
    :func:`~tinkertrace.builder.views.create_typed`); returns its name (None when no call was rebuilt)
    and the count of calls that could not be, by reason."""
    not_rebuilt: Counter[str] = Counter()
    calls = con.sql(text_only_calls_sql(raw, logs)).to_arrow_table().to_pylist()
    if not calls:
        return None, not_rebuilt
    if tokenizer is None:
        not_rebuilt[NO_TOKENIZER] = len(calls)
        return None, not_rebuilt
    by_name = {a.name: a for a in ADAPTERS}
    rows: dict[str, list[Any]] = {
        "trace_id": [],
        "span_id": [],
        "prompt_token_ids": [],
        "response_token_ids": [],
    }
    for call in calls:
        conversation = by_name[call["producer"]].conversation(json.loads(call["attributes"]))  # type: ignore[misc]
        if conversation is None:
            not_rebuilt[NO_MESSAGES] += 1
            continue
        try:
            prompt, response = call_ids(tokenizer, conversation)
        except Exception:
            not_rebuilt[TEMPLATE_FAILED] += 1
            continue
        for key, value in zip(rows, (call["trace_id"], call["span_id"], prompt, response), strict=True):
            rows[key].append(value)
    if not rows["trace_id"]:
        return None, not_rebuilt
    table = pa.table(
        {
            "trace_id": pa.array(rows["trace_id"], pa.string()),
            "span_id": pa.array(rows["span_id"], pa.string()),
            "prompt_token_ids": pa.array(rows["prompt_token_ids"], pa.list_(pa.int32())),
            "response_token_ids": pa.array(rows["response_token_ids"], pa.list_(pa.int32())),
            "response_logprobs": pa.nulls(len(rows["trace_id"]), pa.list_(pa.float32())),
            "token_source": pa.array([sc.SOURCE_RETOKENIZED] * len(rows["trace_id"]), pa.string()),
        }
    )
    con.register("_retokenized_arrow", table)
    con.execute(f"CREATE OR REPLACE TEMP TABLE {TABLE} AS SELECT * FROM _retokenized_arrow")
    con.unregister("_retokenized_arrow")
    return TABLE, not_rebuilt
