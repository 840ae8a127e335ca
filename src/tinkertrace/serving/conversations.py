"""Conversations the endpoint keeps for the Responses API's ``previous_response_id``.

Stored replies (``store``, true by default) are kept in memory, the last :data:`STORED_RESPONSES`
of them; a request naming one continues that conversation.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from tinkertrace.serving.openai_wire.completions import Choice
from tinkertrace.serving.openai_wire.errors import ApiError

STORED_RESPONSES = 4096


class ConversationStore:
    """The chat messages of the last ``capacity`` stored responses, by response id."""

    def __init__(self, capacity: int = STORED_RESPONSES) -> None:
        self.capacity = capacity
        self._conversations: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    def history(self, response_id: str | None) -> list[dict[str, Any]]:
        """The conversation up to and including ``response_id``'s reply; 400 for an unknown id."""
        if response_id is None:
            return []
        if response_id not in self._conversations:
            raise ApiError(
                400,
                f"Previous response with id '{response_id}' not found: this server keeps the last "
                f"{self.capacity} stored responses in memory (send the whole input instead).",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        return self._conversations[response_id]

    def put(self, response_id: str, messages: list[dict[str, Any]]) -> None:
        self._conversations[response_id] = messages
        while len(self._conversations) > self.capacity:
            self._conversations.popitem(last=False)


def assistant_message(choice: Choice) -> dict[str, Any]:
    """The reply as a chat message (what a later turn's template renders)."""
    message: dict[str, Any] = {"role": "assistant", "content": choice.text}
    if choice.tool_calls:
        message["tool_calls"] = [call.as_openai() for call in choice.tool_calls]
    return message
