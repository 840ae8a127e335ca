"""What the test server answers: responders, and its model of byte tokens.

Tokens are bytes: the prompt's token ids are the UTF-8 bytes of a simple rendering of the chat
(:func:`render_chat`), the reply's token ids are the UTF-8 bytes of the reply text, and each token's
logprob is a fixed function of its byte (:func:`byte_logprob`), so tests can compute every expected
value. Replies come from a pluggable :data:`Responder` (default :func:`echo_responder`).
"""

from __future__ import annotations

import itertools
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReplyRequest:
    """What a responder sees: the parsed request of one choice."""

    kind: str  # "chat" | "completion" | "responses"
    model: str
    body: dict[str, Any]
    messages: list[dict[str, Any]] | None  # content as text
    prompt: str | None
    choice_index: int


@dataclass(frozen=True)
class ToolCall:
    """A reply that calls a function (served as a ``function_call`` item on ``/v1/responses``; the chat
    endpoints send its :meth:`text`). Its sampled tokens are the bytes of :meth:`text`, as a model that
    writes ``<tool_call>`` blocks samples them."""

    name: str
    arguments: str  # JSON text
    call_id: str = "call_1"

    def text(self) -> str:
        return "<tool_call>" + json.dumps({"name": self.name, "arguments": self.arguments}) + "</tool_call>"


Responder = Callable[[ReplyRequest], "str | ToolCall"]


def content_text(content: Any) -> str:
    """The text of a message's ``content`` (a string or a list of ``{"type": "text"}`` parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def echo_responder(req: ReplyRequest) -> str:
    """The default reply: ``"echo: "`` and the last user message (or the completion prompt)."""
    if req.messages is not None:
        users = [m for m in req.messages if m.get("role") == "user"]
        return "echo: " + (content_text(users[-1].get("content")) if users else "")
    return "echo: " + (req.prompt or "")


def scripted_responder(replies: list[str]) -> Responder:
    """A responder that returns ``replies`` in order, cycling (thread-safe)."""
    cycle = itertools.cycle(replies)
    lock = threading.Lock()

    def respond(_: ReplyRequest) -> str:
        with lock:
            return next(cycle)

    return respond


def render_chat(messages: list[dict[str, Any]]) -> str:
    """The text the server 'tokenises' for a chat prompt: ``<|role|>\\ncontent\\n`` per message, then
    ``<|assistant|>\\n``."""
    parts = [f"<|{m.get('role', 'user')}|>\n{content_text(m.get('content'))}\n" for m in messages]
    return "".join(parts) + "<|assistant|>\n"


def byte_logprob(token_id: int) -> float:
    """The deterministic logprob of a byte token (exactly representable in float32)."""
    return -((token_id % 16) + 1) / 16.0


def token_text(token_id: int) -> str:
    """The display string of a byte token (vLLM's ``bytes:`` form for non-ASCII bytes)."""
    return chr(token_id) if token_id < 128 else f"bytes:\\x{token_id:02x}"


def top_alternatives(token_id: int, top_n: int) -> list[tuple[str, float]]:
    """The sampled token first, then the next ``top_n - 1`` byte values with lower logprobs."""
    alts = [(token_id, byte_logprob(token_id))]
    alts += [((token_id + k) % 256, byte_logprob(token_id) - k) for k in range(1, top_n)]
    return [(token_text(t), lp) for t, lp in alts[:top_n]]
