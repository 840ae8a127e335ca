"""A hosted ``Owner/Name`` environment addressed as the ``openreward`` SDK addresses the hosted service:
``$OPENREWARD_SESSION_URL`` points at a recording proxy (standing in for the hosted session gateway)
in front of a real local server that serves that one environment, as a deployment does. The SDK
plays an episode through it, then our client does; ours must take the SDK's routes with its headers.

What a local server cannot show: the gateway's routing of ``X-Deployment`` to a deployment, its
check of the API key, and its own session lifetimes; the proxy forwards everything to one server.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tinkertrace.netutil import BackgroundServer
from tinkertrace.ors.client import OrsEnvironment, resolve

from .conftest import ORS_PYTHON, start_ors_server

DEPLOYMENT = "Acme/Arithmetic"
Seen = tuple[str, str, str | None, str | None, bool]  # method, path, X-Deployment, X-API-Key, has a session


def recording_proxy(upstream: str, seen: list[Seen]) -> Starlette:
    """Forward every request to ``upstream`` as it is (redirects go back to the client), noting it."""

    async def forward(request: Request) -> Response:
        h = request.headers
        seen.append(
            (request.method, request.url.path, h.get("x-deployment"), h.get("x-api-key"), "x-session-id" in h)
        )
        headers = {k: v for k, v in h.items() if k.lower() not in ("host", "content-length")}
        async with httpx.AsyncClient(base_url=upstream, timeout=60) as http:
            answer = await http.request(
                request.method, request.url.path, content=await request.body(), headers=headers
            )
        kept = {k: v for k, v in answer.headers.items() if k.lower() in ("content-type", "location")}
        return Response(answer.content, answer.status_code, headers=kept)

    return Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])


async def our_episode(environ: dict[str, str]) -> float | None:
    """The SDK script's episode (tests/ors/sdk_hosted.py), played by our client."""
    async with OrsEnvironment(resolve(DEPLOYMENT, environ)) as env:
        assert await env.splits() == ["train", "test"]
        assert len(await env.tasks("test")) == 16
        assert [t["name"] for t in await env.tools()] == ["submit"]
        async with env.session("test", 0) as session:
            assert (await session.prompt()).startswith("What is")
            result = await session.call("submit", {"answer": "0"})
    return result.reward


@pytest.mark.slow
def test_a_hosted_name_takes_the_sdks_routes_and_headers(tmp_path: Path) -> None:
    server = start_ors_server(tmp_path / "server.log", "--only", "arithmetic")
    seen: list[Seen] = []
    try:
        with BackgroundServer(recording_proxy(server.url, seen)) as proxy:
            environ = {
                "OPENREWARD_SESSION_URL": proxy.url,
                "OPENREWARD_URL": "http://127.0.0.1:9",  # the SDK's web and API host: not used here
                "OPENREWARD_API_KEY": "or-key",
            }
            script = Path(__file__).with_name("sdk_hosted.py")
            sdk = subprocess.run(
                [str(ORS_PYTHON), str(script), DEPLOYMENT],
                env={**os.environ, **environ},
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert sdk.returncode == 0, sdk.stderr[-2000:]
            by_sdk, seen[:] = list(seen), []
            reward = asyncio.run(our_episode(environ))
            ours = list(seen)
    finally:
        server.stop()
    assert reward is not None and float(sdk.stdout.strip()) == reward
    assert {s[3] for s in by_sdk} == {s[3] for s in ours} == {"or-key"}
    routes = {(m, p, has_sid) for m, p, _, _, has_sid in ours}
    assert routes <= {(m, p, has_sid) for m, p, _, _, has_sid in by_sdk}, routes
    for needed in ("/create_session", "/create", "/call", "/arithmetic/call", "/delete", "/splits", "/tools"):
        assert any(p == needed for _, p, *_ in ours), needed
    # the deployment header wherever the SDK sends it on the same route
    sdk_sends = {(m, p) for m, p, d, _, _ in by_sdk if d == DEPLOYMENT}
    assert all(d == DEPLOYMENT for m, p, d, _, _ in ours if (m, p) in sdk_sends)
    assert sdk_sends & {(m, p) for m, p, *_ in ours}


def test_hosted_names_resolve_as_the_sdk_resolves_them() -> None:
    key = {"OPENREWARD_API_KEY": "k"}
    assert resolve(DEPLOYMENT, key).base_url == "https://sessions.openreward.ai"
    assert resolve(DEPLOYMENT, {"OPENREWARD_URL": "http://or.test:8"}).base_url == "http://sessions.or.test:8"
    both = {"OPENREWARD_URL": "http://or.test:8", "OPENREWARD_SESSION_URL": "http://127.0.0.1:7/"}
    assert resolve(DEPLOYMENT, both).base_url == "http://127.0.0.1:7"
    assert resolve(DEPLOYMENT, key).headers() == {"X-Deployment": DEPLOYMENT, "X-API-Key": "k"}
