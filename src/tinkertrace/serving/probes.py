"""What a harness probes before its first call: ``HEAD`` / ``GET`` on its base URL and on
``/api/hello`` (Claude Code sends ``HEAD /api/hello`` to ``ANTHROPIC_BASE_URL``), answered 200 as the
real service answers them, bare or under a rollout prefix (``/rollouts/{id}[/task/{t}...]``)."""

from __future__ import annotations

import re

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Route
from starlette.types import Scope

# a rollout prefix (rollout_routing's grammar) followed by nothing or /api/hello
_PREFIXED_PROBE = re.compile(r"^/rollouts/[^/]+(?:/(?:task|attempt|split|agent)/[^/]*)*/?(?:api/hello/?)?$")


async def probe(request: Request) -> Response:
    """200 ``{"status": "ok"}`` (a HEAD gets the headers only)."""
    return JSONResponse({"status": "ok"})


class _PrefixedProbe(Route):
    """The probe under a rollout prefix; every other path under ``/rollouts/`` is left unmatched (so
    it stays the 404 that explains the prefix)."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] == "http" and _PREFIXED_PROBE.match(scope["path"]):
            return super().matches(scope)
        return Match.NONE, {}


def probe_routes() -> list[Route]:
    """The probe routes (``GET`` also answers ``HEAD``)."""
    return [
        Route("/", probe, methods=["GET"]),
        Route("/api/hello", probe, methods=["GET"]),
        _PrefixedProbe("/rollouts/{prefix:path}", probe, methods=["GET"]),
    ]
