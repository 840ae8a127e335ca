"""The stream events of a ``/v1/responses`` answer, in OpenAI's order.

``response.created`` and ``response.in_progress`` (the Response with no output yet), then per output
item ``response.output_item.added``; for a message ``response.content_part.added``, the
``response.output_text.delta`` events, ``response.output_text.done`` and
``response.content_part.done``; for a function call the ``response.function_call_arguments.delta``
events and ``.done``; ``response.output_item.done``; and last ``response.completed``
(``response.incomplete`` when ``max_output_tokens`` cut the reply) carrying the whole Response with
its token ids. Every event has a ``sequence_number``. ``split`` cuts a text (with its per-token
logprobs) into the deltas sent; by default the whole text is one delta (the backend returns whole
samples).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from tinkertrace import semconv

EXTENSION_FIELDS = (
    semconv.RESPONSES_PROMPT_TOKEN_IDS,
    semconv.RESPONSES_OUTPUT_TOKEN_IDS,
    semconv.RESPONSES_OUTPUT_LOGPROBS,
)

Logprobs = list[dict[str, Any]]
TextSplit = Callable[[str, Logprobs], list[tuple[str, Logprobs]]]


def one_delta(text: str, logprobs: Logprobs) -> list[tuple[str, Logprobs]]:
    return [(text, logprobs)]


def _item_events(index: int, item: dict[str, Any], split: TextSplit) -> list[dict[str, Any]]:
    """The events of one finished output item, from its ``added`` to its ``done``."""
    started = copy.deepcopy(item)
    started["status"] = "in_progress"
    at = {"output_index": index, "item_id": item["id"]}
    if item["type"] == "function_call":
        started["arguments"] = ""
        middle = [
            {"type": "response.function_call_arguments.delta", **at, "delta": piece}
            for piece, _ in split(item["arguments"], [])
        ]
        middle.append(
            {
                "type": "response.function_call_arguments.done",
                **at,
                "name": item["name"],
                "arguments": item["arguments"],
            }
        )
    else:
        started["content"] = []
        middle = []
        for k, part in enumerate(item["content"]):
            where = {**at, "content_index": k}
            logprobs = [
                {"token": lp["token"], "logprob": lp["logprob"], "top_logprobs": lp["top_logprobs"]}
                for lp in part.get("logprobs") or []
            ]
            empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            middle.append({"type": "response.content_part.added", **where, "part": empty})
            middle += [
                {"type": "response.output_text.delta", **where, "delta": piece, "logprobs": piece_logprobs}
                for piece, piece_logprobs in split(part["text"], logprobs)
            ]
            middle += [
                {"type": "response.output_text.done", **where, "text": part["text"], "logprobs": logprobs},
                {"type": "response.content_part.done", **where, "part": part},
            ]
    return [
        {"type": "response.output_item.added", "output_index": index, "item": started},
        *middle,
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]


def stream_events(response: dict[str, Any], split: TextSplit = one_delta) -> list[dict[str, Any]]:
    """All events of a streamed answer whose final Response is ``response``."""
    pending = {k: v for k, v in response.items() if k not in EXTENSION_FIELDS and k != "usage"}
    pending.update(status="in_progress", output=[], incomplete_details=None)
    final = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    events = [
        {"type": "response.created", "response": pending},
        {"type": "response.in_progress", "response": pending},
        *(event for i, item in enumerate(response["output"]) for event in _item_events(i, item, split)),
        {"type": final, "response": response},
    ]
    return [{**event, "sequence_number": n} for n, event in enumerate(events)]
