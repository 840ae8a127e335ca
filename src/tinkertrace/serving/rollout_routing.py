"""Which rollout a served call belongs to, from its headers or from a URL prefix.

Headers (the SDK sends the first with every call inside ``@traced_rollout``)::

    x-tinkertrace-rollout-id   x-tinkertrace-task-id   x-tinkertrace-attempt
    x-tinkertrace-split        x-tinkertrace-agent-name

A URL prefix says the same for an agent whose only setting is its base URL (Agent-lightning's and
rLLM's way)::

    http://host:port/rollouts/{rollout_id}[/task/{task_id}][/attempt/{n}][/split/{name}][/agent/{name}]/v1

:class:`RolloutPrefix` (ASGI middleware) strips the prefix and sets those headers (the prefix wins over
headers the request also sent), so routes, admission and recording read one place.

Every id and name is text decoded one way wherever it arrives: a header's bytes as UTF-8, a URL
segment percent-decoded then UTF-8 (``/rollouts/r%C3%A9sum%C3%A9/v1`` names ``résumé``), the rollout
routes' ``/v1/rollouts/{id}/...`` segment too, so a rollout id that is recorded can be rewarded and
finished. A rollout id that could not make that round trip is a 400 naming the rule
(:func:`check_name`) at the first call: empty, over :data:`MAX_NAME_CHARS` characters, containing
``/`` or a control character, with whitespace at either end (a header cannot carry it), or bytes that
are not UTF-8. Task ids, splits and agent names are never part of a route: any UTF-8 text
(``gsm8k/17`` included, ``%2F`` in a URL segment) is taken.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, unquote_to_bytes

from tinkertrace import semconv
from tinkertrace.serving.openai_wire.errors import ApiError

MAX_NAME_CHARS = 256
# URL prefix segment name -> the header it sets
PREFIX_SEGMENTS = {
    "task": semconv.HEADER_TASK_ID,
    "attempt": semconv.HEADER_ATTEMPT,
    "split": semconv.HEADER_SPLIT,
    "agent": semconv.HEADER_AGENT_NAME,
}
# on the raw (still percent-encoded) path: a prefix is followed by /v1 (else the path is unknown, 404)
_PREFIX = re.compile(
    r"^/rollouts/(?P<rollout>[^/]*)(?P<pairs>(?:/(?:task|attempt|split|agent)/[^/]*)*)(?P<rest>/v1(?:/.*)?)$"
)
_ROUTE_ID = re.compile(r"^/v1/rollouts/(?P<rollout>[^/]*)/")  # the reward and finish routes


def check_name(value: str, what: str) -> str:
    """``value`` when it can travel as a URL segment and a header and come back the same; else a 400
    :class:`ApiError` naming ``what`` and the rule it breaks."""
    problem = None
    if not value:
        problem = "it is empty"
    elif len(value) > MAX_NAME_CHARS:
        problem = f"it is {len(value)} characters long, over the limit of {MAX_NAME_CHARS}"
    elif "/" in value:
        problem = "it contains '/' (it could not be a URL path segment)"
    elif any(unicodedata.category(c) == "Cc" for c in value):
        problem = "it contains a control character"
    elif value != value.strip():
        problem = "it starts or ends with whitespace (a header cannot carry it)"
    if problem is not None:
        shown = value if len(value) <= 80 else value[:77] + "..."
        raise ApiError(400, f"Invalid {what} {shown!r}: {problem}.", code="invalid_rollout_identity")
    return value


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(
            400,
            f"Invalid {what}: its bytes are not UTF-8 text ({raw[:40]!r}).",
            code="invalid_rollout_identity",
        ) from None


def segment_text(segment: str, what: str) -> str:
    """A raw URL path segment percent-decoded as UTF-8."""
    return _utf8(unquote_to_bytes(segment), what)


def header_text(headers: Mapping[str, str], name: str) -> str | None:
    """Header ``name`` of a Starlette request (whose values are latin-1 decoded) as UTF-8 text; None
    when absent; a rollout id checked by :func:`check_name`."""
    value = headers.get(name)
    if value is None:
        return None
    text = _utf8(value.encode("latin-1"), f"{name} header")
    return check_name(text, f"{name} header") if name == semconv.HEADER_ROLLOUT_ID else text


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
            rollout_id=header_text(headers, semconv.HEADER_ROLLOUT_ID),
            task_id=header_text(headers, semconv.HEADER_TASK_ID) or None,
            attempt=int(attempt) if attempt is not None else 0,
            split=header_text(headers, semconv.HEADER_SPLIT) or "train",
            agent_name=header_text(headers, semconv.HEADER_AGENT_NAME) or None,
        )


def split_prefix(raw_path: str) -> tuple[str, dict[str, str]] | None:
    """``(raw path without the prefix, {header: value})`` for a ``/rollouts/{id}/.../v1/...`` path as
    sent (still percent-encoded), else None; a 400 :class:`ApiError` for an id that breaks a rule."""
    match = _PREFIX.match(raw_path)
    if match is None:
        return None
    rollout_id = check_name(segment_text(match["rollout"], "rollout id"), "rollout id")
    headers = {semconv.HEADER_ROLLOUT_ID: rollout_id}
    parts = match["pairs"].split("/")[1:]
    for key, value in zip(parts[::2], parts[1::2], strict=True):
        headers[PREFIX_SEGMENTS[key]] = segment_text(value, f"{key} in the URL")
    return match["rest"], headers


class RolloutPrefix:
    """ASGI middleware: ``/rollouts/{id}/.../v1/x`` is served as ``/v1/x`` with the identity headers
    (UTF-8 bytes); the id of ``/v1/rollouts/{id}/...`` is checked as a prefix's is."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            raw = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1").partition("?")[0]
            try:
                if (route := _ROUTE_ID.match(raw)) is not None:
                    check_name(segment_text(route["rollout"], "rollout id"), "rollout id")
                elif raw.startswith("/rollouts/") and (found := split_prefix(raw)) is not None:
                    rest, named = found
                    kept = [(k, v) for k, v in scope["headers"] if k.decode("latin-1").lower() not in named]
                    added = [(k.encode(), v.encode("utf-8")) for k, v in named.items()]
                    path = unquote(rest, errors="strict")
                    scope = {
                        **scope,
                        "path": path,
                        "raw_path": rest.encode("latin-1"),
                        "headers": kept + added,
                    }
            except (ApiError, UnicodeDecodeError) as err:
                error = err if isinstance(err, ApiError) else ApiError(400, f"The URL is not UTF-8: {err}.")
                await error.response(scope["path"])(scope, receive, send)
                return
        await self.app(scope, receive, send)
