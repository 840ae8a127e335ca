"""What a harness probes before its first call: ``HEAD`` / ``GET`` on its base URL and on
``/api/hello`` (Claude Code sends ``HEAD /api/hello`` to ``ANTHROPIC_BASE_URL``), answered 200 as the
real service answers them, bare or under a rollout prefix (``/rollouts/{id}[/task/{t}...]``)."""

from __future__ import annotations

import re

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

# a rollout prefix (rollout_routing's grammar) followed by nothing or /api/hello
_PREFIXED_PROBE = re.compile(r"^/rollouts/[^/]+(?:/(?:task|attempt|split|agent)/[^/]*)*/?(?:api/hello/?)?$")


async def probe(request: Request) -> Response:
    """200 ``{"status": "ok"}`` (a HEAD gets the headers only)."""
    if request.url.path.startswith("/rollouts/") and not _PREFIXED_PROBE.match(request.url.path):
        raise HTTPException(404)
    return JSONResponse({"status": "ok"})


def probe_routes() -> list[Route]:
    """The probe routes (``GET`` also answers ``HEAD``)."""
    return [Route(path, probe, methods=["GET"]) for path in ("/", "/api/hello", "/rollouts/{prefix:path}")]
