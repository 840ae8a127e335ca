"""`tinkertrace proxy`: the endpoint's capture in front of any OpenAI-compatible server.

Requests to ``/v1/*`` pass through to ``upstream`` (vLLM with ``return_token_ids``, SGLang, a hosted
endpoint, or ``tinkertrace serve``). On the LLM routes (chat, completions, Responses) the request
asks for token ids and logprobs as the SDK asks (:meth:`~tinkertrace.sdk.llm_call.LlmCall.
extended_body`: only fields the agent did not set; an upstream that refuses them with a 400 gets the
agent's own body again and is not asked again for a while), and what comes back is recorded as an LLM
span of the SDK's contract (``token_source`` says ``server`` where the upstream gave ids). The answer
reaches the agent byte for byte as the upstream sent it, streams included (the fields asked for on
the agent's behalf stay in it, as with the SDK). Rollout identity (URL prefix, ``x-tinkertrace-*``
headers, ``traceparent``) works as on the endpoint and is passed on to the upstream, so an upstream
``tinkertrace serve`` admits new rollouts by it (staleness). Rewards and rollout ends:
``POST /v1/rollouts/{id}/reward`` and ``/finish``, as on the endpoint. Headers are passed on as the
bytes the agent sent (an id in UTF-8 reaches the upstream as sent); the proxy's own errors (its key,
its body limits, an unknown path, an upstream that does not answer) are JSON in the route's API's shape.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tinkertrace.sdk.llm_call import LlmCall
from tinkertrace.serving.guard import check_token, guarded, http_error
from tinkertrace.serving.limits import BodyLimit, RequestLimits
from tinkertrace.serving.openai_wire.errors import ApiError
from tinkertrace.serving.probes import probe_routes
from tinkertrace.serving.recording import CallRecorder
from tinkertrace.serving.reward_routes import rollout_routes
from tinkertrace.serving.rollout_routing import RolloutPrefix

# headers not passed on: hop-by-hop ones, and those httpx / the ASGI server set themselves
_REQUEST_DROPPED = {
    b"host",
    b"content-length",
    b"connection",
    b"keep-alive",
    b"transfer-encoding",
    b"upgrade",
}
_READABLE = {"gzip", "deflate", "identity"}
_RESPONSE_DROPPED = {"content-length", "connection", "keep-alive", "transfer-encoding", "date", "server"}


class CaptureProxy:
    """Handlers forwarding to ``upstream`` (a base URL ending in ``/v1``)."""

    def __init__(
        self,
        upstream: str,
        *,
        recorder: CallRecorder | None,
        api_key: str | None = None,
        upstream_api_key: str | None = None,
        timeout_s: float = 600.0,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.recorder = recorder
        self.api_key = api_key
        self.upstream_api_key = upstream_api_key
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0))
        self.forwarded = 0
        self.limits = RequestLimits()

    def authenticate(self, request: Request) -> None:
        if self.api_key is not None:
            check_token(request, self.api_key, "API key")

    def _headers(self, request: Request) -> list[tuple[bytes, bytes]]:
        """The agent's headers as it sent them (bytes), less hop-by-hop ones, keys adjusted."""
        dropped = set(_REQUEST_DROPPED)
        if self.upstream_api_key is not None or self.api_key is not None:  # not the upstream's key
            dropped |= {b"authorization", b"x-api-key"}
        headers = [(k, v) for k, v in request.headers.raw if k.lower() not in dropped]
        for i, (key, value) in enumerate(headers):
            if key.lower() == b"accept-encoding":  # only encodings the recorder can read (gzip, deflate)
                offered = value.decode("latin-1").split(",")
                accepted = [e for e in offered if e.split(";")[0].strip() in _READABLE]
                headers[i] = (key, (",".join(accepted) or "identity").encode())
        if self.upstream_api_key is not None:
            headers.append((b"authorization", f"Bearer {self.upstream_api_key}".encode()))
        return headers

    async def _send(self, request: Request, body: bytes) -> httpx.Response:
        path = request.url.path.removeprefix("/v1")
        url = self.upstream + path + (f"?{request.url.query}" if request.url.query else "")
        headers = self._headers(request)
        outgoing = self.client.build_request(request.method, url, headers=headers, content=body)
        try:
            return await self.client.send(outgoing, stream=True)
        except httpx.HTTPError as exc:
            message = f"The upstream {self.upstream} did not answer: {exc}"
            raise ApiError(502, message, type="server_error", code="bad_gateway") from exc

    async def forward(self, request: Request) -> Response:
        """Pass the request on (the extended body on recorded routes) and stream the answer back."""
        call: LlmCall | None = getattr(request.state, "llm_call", None)
        upstream = await self._send(request, await request.body())
        if call is not None and call.retry_without_injection(upstream):
            await upstream.aclose()
            upstream = await self._send(request, call.drop_injection())
            call.judge_refusal(upstream.status_code)
        self.forwarded += 1
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _RESPONSE_DROPPED}
        return StreamingResponse(_relayed(upstream), status_code=upstream.status_code, headers=headers)

    async def health(self, request: Request) -> Response:
        body: dict[str, Any] = {
            "status": "ok",
            "upstream": self.upstream,
            "forwarded": self.forwarded,
            "requests_refused": self.limits.refused,
        }
        if self.recorder is not None:
            body["recording"] = self.recorder.stats()
        return JSONResponse(body)


async def _relayed(upstream: httpx.Response) -> AsyncIterator[bytes]:
    """The upstream's body as it arrives, undecoded (its content-encoding header goes with it)."""
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk
    finally:
        await upstream.aclose()


def create_proxy_app(
    upstream: str,
    *,
    recorder: CallRecorder | None = None,
    api_key: str | None = None,
    upstream_api_key: str | None = None,
    timeout_s: float = 600.0,
    limits: RequestLimits | None = None,
) -> Starlette:
    """The capture proxy's ASGI app (see the module docstring). ``api_key``: required from agents
    (Bearer or x-api-key) on every route but ``/health`` when set; ``upstream_api_key``: sent to the
    upstream (default: the agent's own Authorization header, when the proxy has no key of its own);
    ``limits``: the request body size and time limits on every route (default 4 MiB, 60 s)."""
    limits = limits or RequestLimits()
    proxy = CaptureProxy(
        upstream, recorder=recorder, api_key=api_key, upstream_api_key=upstream_api_key, timeout_s=timeout_s
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await proxy.client.aclose()
            if recorder is not None:
                recorder.close()

    def g(handler: Any, recorded: bool = False) -> Any:
        return guarded(handler, proxy.authenticate, recorder if recorded else None)

    routes = [
        *rollout_routes(recorder, g),
        Route("/v1/{path:path}", g(proxy.forward, recorded=True), methods=["GET", "POST", "DELETE"]),
        Route("/health", proxy.health, methods=["GET"]),
        *probe_routes(),  # HEAD/GET on the base URL and /api/hello, as harnesses probe (as serve answers)
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: http_error},
        middleware=[Middleware(BodyLimit, limits=limits), Middleware(RolloutPrefix)],
    )
    app.state.proxy = proxy
    proxy.limits = limits
    return app
