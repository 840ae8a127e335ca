"""What the endpoint keeps of the calls it serves beyond their spans: which answers a rollout gave.

A :class:`ServedCall` is the SDK's :class:`~tinkertrace.sdk.llm_call.LlmCall` with two differences:
a failed call (status 400 or more) records its error, status and the sizes of its request and answer
(``http.request.body.size``, ``http.response.body.size``), not the request's messages (a refused
16 MB prompt is not copied into a span); and its response id, once parsed (on the export thread, or
on demand), is published to its rollout's :class:`ServedAnswers`, so a reward naming a
``response_id`` is checked against the answers that rollout really gave.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from tinkertrace import semconv
from tinkertrace.sdk.llm_call import LlmCall
from tinkertrace.sdk.response_parse import ResponseRecord


class ServedCall(LlmCall):
    """An LLM call answered by the endpoint or the proxy (see the module docstring)."""

    def __init__(self, *args: Any, on_response_id: Callable[[str], None] | None = None) -> None:
        super().__init__(*args)
        self._record: ResponseRecord | None = None
        self.on_response_id = on_response_id

    def _failed(self) -> bool:
        return self.status >= 400

    def input_messages(self) -> list[dict[str, Any]]:
        return [] if self._failed() else super().input_messages()

    def request_attributes(self) -> dict[str, Any]:
        attributes = super().request_attributes()
        if self._failed():
            attributes.pop(semconv.GENAI_INPUT_MESSAGES, None)
            attributes["http.request.body.size"] = len(self.raw)
            attributes["http.response.body.size"] = sum(len(chunk) for chunk in self._chunks)
        return attributes

    def response_record(self) -> ResponseRecord:
        """Parsed once the call has ended (kept, and its response id published); before, each time."""
        if self._record is not None:
            return self._record
        record = super().response_record()
        if self._done:
            self._record = record
            if record.response_id and self.on_response_id is not None:
                self.on_response_id(str(record.response_id))
        return record

    def response_id(self) -> str | None:
        """The answer's id as far as it has been read (None: failed, not yet known, unreadable)."""
        if not self.status or self._failed():
            return None
        try:
            found = self.response_record().response_id
        except Exception:  # not readable (yet): the span will say why
            return None
        return str(found) if found else None


class ServedAnswers:
    """The response ids one rollout's calls answered with: published ones, and calls not yet parsed."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self._calls: weakref.WeakSet[ServedCall] = weakref.WeakSet()  # gone once exported and dropped

    def track(self, call: ServedCall) -> None:
        call.on_response_id = self.ids.add
        self._calls.add(call)

    def __contains__(self, response_id: object) -> bool:
        if response_id in self.ids:
            return True
        for call in list(self._calls):  # not yet exported: read the answer now
            found = call.response_id()
            if found is not None:
                self.ids.add(found)
        return response_id in self.ids
