"""Which rollout a served call belongs to, from its headers or from a URL prefix.

Headers (the SDK sends the first with every call inside ``@traced_rollout``)::

    x-tinkertrace-rollout-id   x-tinkertrace-task-id   x-tinkertrace-attempt
    x-tinkertrace-split        x-tinkertrace-agent-name

A URL prefix says the same for an agent whose only setting is its base URL (Agent-lightning's and
rLLM's way)::

    http://host:port/rollouts/{rollout_id}[/task/{task_id}][/attempt/{n}][/split/{name}][/agent/{name}]/v1

:class:`RolloutPrefix` (ASGI middleware) strips the prefix and sets those headers (the prefix wins over
headers the request also sent), so routes, admission and recording read one place.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tinkertrace import semconv
from tinkertrace.serving.openai_wire.errors import ApiError

# URL prefix segment name -> the header it sets
PREFIX_SEGMENTS = {
    "task": semconv.HEADER_TASK_ID,
    "attempt": semconv.HEADER_ATTEMPT,
    "split": semconv.HEADER_SPLIT,
    "agent": semconv.HEADER_AGENT_NAME,
}
_PREFIX = re.compile(
    r"^/rollouts/(?P<rollout>[^/]+)(?P<pairs>(?:/(?:task|attempt|split|agent)/[^/]+)*)(?P<rest>/.*)$"
)


@dataclass(frozen=True)
class CallIdentity:
    """The rollout, task, attempt, split and agent a call names (all optional but the defaults)."""

    rollout_id: str | None = None
    task_id: str | None = None
    attempt: int = 0
    split: str = "train"
    agent_name: str | None = None

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> CallIdentity:
        """Read the identity headers; a 400 :class:`ApiError` names one that is malformed."""
        attempt = headers.get(semconv.HEADER_ATTEMPT)
        if attempt is not None and not attempt.strip().isdigit():
            message = f"Invalid {semconv.HEADER_ATTEMPT} {attempt!r}: expected a non-negative integer."
            raise ApiError(400, message, code="invalid_value")
        return cls(
            rollout_id=headers.get(semconv.HEADER_ROLLOUT_ID) or None,
            task_id=headers.get(semconv.HEADER_TASK_ID) or None,
            attempt=int(attempt) if attempt is not None else 0,
            split=headers.get(semconv.HEADER_SPLIT) or "train",
            agent_name=headers.get(semconv.HEADER_AGENT_NAME) or None,
        )


def split_prefix(path: str) -> tuple[str, dict[str, str]] | None:
    """``(path without the prefix, {header: value})`` for a ``/rollouts/{id}/...`` path (already
    percent-decoded, as ASGI gives it), else None."""
    match = _PREFIX.match(path)
    if match is None:
        return None
    headers = {semconv.HEADER_ROLLOUT_ID: match["rollout"]}
    parts = match["pairs"].split("/")[1:]
    for key, value in zip(parts[::2], parts[1::2], strict=True):
        headers[PREFIX_SEGMENTS[key]] = value
    return match["rest"], headers


class RolloutPrefix:
    """ASGI middleware: ``/rollouts/{id}/.../v1/x`` is served as ``/v1/x`` with the identity headers."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/rollouts/"):
            found = split_prefix(scope["path"])
            if found is not None:
                path, named = found
                kept = [(k, v) for k, v in scope["headers"] if k.decode("latin-1").lower() not in named]
                added = [(k.encode(), v.encode("utf-8")) for k, v in named.items()]
                scope = {**scope, "path": path, "raw_path": path.encode(), "headers": kept + added}
        await self.app(scope, receive, send)
