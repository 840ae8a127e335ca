"""A client of the Open Reward Standard (ORS) wire protocol, over httpx.

An environment reference (:func:`resolve`) is a URL (``http://host:port/NAME``: that server's
environment ``NAME``; no path: its default one), a bare ``NAME`` on the server in ``$OPENREWARD_URL``
(as its ``/list_environments`` gives it), or a hosted ``Owner/Name``, addressed as the ``openreward``
SDK addresses it: the ``X-Deployment`` header on bare routes (``/tools``, ``/call``; a deployment's
server redirects them to its one environment) to ``$OPENREWARD_SESSION_URL``, else the ``sessions.``
host of ``$OPENREWARD_URL``, else the hosted session server; ``$OPENREWARD_API_KEY`` is sent as
``X-API-Key``.

:class:`OrsEnvironment` lists splits, tasks and tools; :meth:`OrsEnvironment.session` opens one
episode (a session id from ``POST /create_session``, then ``POST /create`` with it as
``X-Session-ID``) whose :meth:`OrsSession.call` runs a tool and reads the SSE answer (``chunk``
events, then ``end``; ``error`` when the tool raised); the session is deleted on exit. A hosted
environment's listings run in a session of their own, as the SDK's do.

Failures the rollout cannot recover from (server unreachable, a tool that raised, a session gone)
raise :class:`OrsError` with the reason; a call the server refused (unknown tool, bad input, episode
over) is a :class:`ToolResult` with ``error`` set.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

HOSTED_SESSIONS = "https://sessions.openreward.ai"

log = logging.getLogger(__name__)


class OrsError(RuntimeError):
    """An ORS request that failed; ``reason``: ``unreachable``, ``http``, ``tool_error``, ``session_gone``."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class EnvRef:
    """Where an environment is served: base URL, its name on that server (None: the default one), the
    hosted deployment (``Owner/Name``) and the API key sent with each request."""

    base_url: str
    name: str | None = None
    deployment: str | None = None
    api_key: str | None = field(default=None, repr=False)

    def path(self, route: str) -> str:
        """The URL path of ``route`` (``tools``, ``call``, ...) on this environment."""
        return f"/{self.name}/{route}" if self.name else f"/{route}"

    def headers(self) -> dict[str, str]:
        """The deployment and key headers of every request (the SDK's)."""
        out = {"X-Deployment": self.deployment} if self.deployment else {}
        return out | ({"X-API-Key": self.api_key} if self.api_key else {})


def resolve(ref: str, environ: Mapping[str, str] | None = None) -> EnvRef:
    """The :class:`EnvRef` of an environment reference (see the module's docstring)."""
    environ = os.environ if environ is None else environ
    key = environ.get("OPENREWARD_API_KEY") or None
    if ref.startswith(("http://", "https://")):
        parts = urlsplit(ref)
        head, _, name = parts.path.rstrip("/").rpartition("/")
        return EnvRef(f"{parts.scheme}://{parts.netloc}{head}", name or None, api_key=key)
    server = environ.get("OPENREWARD_URL")
    if "/" in ref:
        sessions = environ.get("OPENREWARD_SESSION_URL") or (server and sessions_host(server))
        return EnvRef((sessions or HOSTED_SESSIONS).rstrip("/"), None, deployment=ref, api_key=key)
    if not server:
        raise OrsError(
            f"OpenReward environment {ref!r} names no server: give a URL (http://HOST:PORT/{ref}) or set "
            "OPENREWARD_URL",
            "unreachable",
        )
    return EnvRef(server.rstrip("/"), ref, api_key=key)


def sessions_host(url: str) -> str:
    """``url`` on its ``sessions.`` subdomain (where the SDK finds hosted environments)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"sessions.{parts.netloc}"))


@dataclass
class ToolResult:
    """What a tool call returned: its text blocks joined, reward, whether the episode finished, and
    the server's refusal reason (``not_found``, ``input_validation``, ``episode_finished``) if any."""

    text: str
    reward: float | None = None
    finished: bool = False
    error: str | None = None


def tool_result(answer: Mapping[str, Any]) -> ToolResult:
    """A :class:`ToolResult` from the JSON of a call's ``end`` event."""
    if not answer.get("ok"):
        reason = str(answer.get("reason") or "input_validation")
        return ToolResult(f"Error: {answer.get('error') or reason}", error=reason)
    output = answer["output"]
    texts = [b.get("text", "") for b in output.get("blocks") or () if b.get("type", "text") == "text"]
    reward = output.get("reward")
    return ToolResult(
        "\n".join(texts), None if reward is None else float(reward), bool(output.get("finished"))
    )


async def sse_events(response: httpx.Response) -> AsyncIterator[tuple[str, str]]:
    """The (event, data) pairs of a server-sent-event stream (multi-line data joined by newlines)."""
    event, data = "message", list[str]()
    async for line in response.aiter_lines():
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", list[str]()
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        yield event, "\n".join(data)


def check(response: httpx.Response, what: str, sid: str | None) -> None:
    """OrsError for an error status: ``session_gone`` for a session the server no longer holds."""
    gone = response.status_code == 410 or (
        response.status_code == 404 and "Active environment" in response.text
    )
    if gone and sid is not None:
        raise OrsError(
            f"ORS session {sid} is gone (reaped or deleted): {response.text[:200]}", "session_gone"
        )
    if response.is_error:
        raise OrsError(f"ORS {what} answered {response.status_code}: {response.text[:300]}", "http")


class OrsEnvironment:
    """One ORS environment over an ``httpx.AsyncClient``; an async context manager."""

    def __init__(self, ref: EnvRef | str, timeout_s: float = 120.0) -> None:
        self.ref = resolve(ref) if isinstance(ref, str) else ref
        self.http = httpx.AsyncClient(
            base_url=self.ref.base_url, headers=self.ref.headers(), timeout=timeout_s, follow_redirects=True
        )

    async def __aenter__(self) -> OrsEnvironment:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()

    async def request(self, method: str, route: str, sid: str | None = None, **kwargs: Any) -> Any:
        """One JSON request; OrsError for a connection failure or an error status."""
        headers = {"X-Session-ID": sid} if sid else {}
        try:
            response = await self.http.request(method, route, headers=headers, **kwargs)
        except httpx.HTTPError as exc:
            raise OrsError(
                f"ORS server {self.ref.base_url} unreachable ({type(exc).__name__}: {exc})", "unreachable"
            ) from None
        check(response, f"{method} {route}", sid)
        return response.json()

    async def new_sid(self) -> str:
        """A session id minted by the server (``POST /create_session``: an SSE ``task_id`` event)."""
        try:
            async with self.http.stream("POST", "/create_session") as response:
                if response.is_error:
                    await response.aread()
                    check(response, "POST /create_session", None)
                sid = "".join([d async for e, d in sse_events(response) if e == "task_id"]).strip()
        except httpx.HTTPError as exc:
            raise OrsError(
                f"ORS server {self.ref.base_url} unreachable ({type(exc).__name__}: {exc})", "unreachable"
            ) from None
        if not sid:
            raise OrsError(f"ORS server {self.ref.base_url}: /create_session gave no session id", "http")
        return sid

    async def listing(self, method: str, route: str, **kwargs: Any) -> Any:
        """A request about the environment; a hosted one's in a session of its own (as the SDK does)."""
        if not self.ref.deployment:
            return await self.request(method, route, **kwargs)
        sid = await self.new_sid()
        try:
            return await self.request(method, route, sid=sid, **kwargs)
        finally:
            with suppress(OrsError):
                await self.request("POST", "/delete_session", sid=sid)

    async def environments(self) -> list[str]:
        """The environment names the server lists."""
        return list(await self.request("GET", "/list_environments"))

    async def splits(self) -> list[str]:
        """The environment's split names."""
        return [
            s["name"] if isinstance(s, dict) else str(s)
            for s in await self.listing("GET", self.ref.path("splits"))
        ]

    async def tasks(self, split: str) -> list[Any]:
        """The task specs of ``split``."""
        return list((await self.listing("POST", self.ref.path("tasks"), json={"split": split}))["tasks"])

    async def tools(self) -> list[dict[str, Any]]:
        """The environment's tools: ``name``, ``description``, ``input_schema`` (JSON Schema or None)."""
        return list((await self.listing("GET", self.ref.path("tools")))["tools"])

    @asynccontextmanager
    async def session(self, split: str, index: int) -> AsyncIterator[OrsSession]:
        """An episode on task ``index`` of ``split``, deleted on exit, a cancelled one too: a ``/create``
        already sent is let finish first (else the server could make the session after its delete)."""
        session = OrsSession(self, await self.new_sid())
        body: dict[str, Any] = {"split": split, "index": index}
        if self.ref.name:
            body["env_name"] = self.ref.name
        created = asyncio.ensure_future(self.request("POST", "/create", sid=session.sid, json=body))
        try:
            await asyncio.shield(created)
            yield session
        finally:
            await asyncio.wait({created})
            await session.delete()


@dataclass
class OrsSession:
    """One episode (an ORS session) of an :class:`OrsEnvironment`."""

    env: OrsEnvironment
    sid: str

    async def prompt(self) -> str:
        """The task's prompt: its text blocks joined."""
        blocks = await self.env.request("GET", self.env.ref.path("prompt"), sid=self.sid)
        return "\n".join(b.get("text", "") for b in blocks if b.get("type", "text") == "text")

    async def call(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """Run tool ``name`` on the server. OrsError when the tool raised, the session is gone or the
        server is unreachable."""
        route = self.env.ref.path("call")
        headers = {"X-Session-ID": self.sid}
        payload, failure = "", None
        try:
            async with self.env.http.stream(
                "POST", route, headers=headers, json={"name": name, "input": dict(arguments)}
            ) as response:
                if response.is_error:
                    await response.aread()
                    check(response, f"POST {route}", self.sid)
                async for event, data in sse_events(response):
                    if event in ("chunk", "end"):
                        payload += data
                    elif event == "error":
                        failure = data
        except httpx.HTTPError as exc:
            raise OrsError(
                f"ORS tool {name!r} call failed ({type(exc).__name__}: {exc})", "unreachable"
            ) from None
        if failure is not None:
            raise OrsError(f"ORS tool {name!r} raised on the server: {failure[:300]}", "tool_error")
        if not payload:
            raise OrsError(f"ORS tool {name!r}: the answer stream ended without a result", "unreachable")
        return tool_result(json.loads(payload))

    async def ping(self) -> None:
        """Keep the session from being reaped while the policy thinks."""
        await self.env.request("POST", "/ping", sid=self.sid)

    async def ping_every(self, interval_s: float) -> None:
        """Ping the session every ``interval_s`` seconds until cancelled. A failed ping is logged, not
        raised; a session already gone stops the pinging (the episode's next request reports it)."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.ping()
            except Exception as exc:  # a ping is best effort: the episode's own requests fail for real
                log.warning("ORS session %s: ping failed: %s", self.sid, exc)
                if isinstance(exc, OrsError) and exc.reason == "session_gone":
                    return

    @asynccontextmanager
    async def kept_alive(self, interval_s: float) -> AsyncIterator[OrsSession]:
        """The session, pinged every ``interval_s`` seconds in the background until the block ends (or
        is cancelled), so a server that reaps idle sessions (900 s unpinged) keeps it while the policy
        thinks; tool calls do not count as activity on the server, only ``/ping`` and ``/create``."""
        pinger = asyncio.ensure_future(self.ping_every(interval_s))
        try:
            yield self
        finally:
            pinger.cancel()
            await asyncio.wait({pinger})  # stopped before the session is deleted

    async def delete(self) -> None:
        """End the session on the server (a session already gone, or a server gone, is no error)."""
        with suppress(OrsError):
            await self.env.request("POST", "/delete", sid=self.sid)
        with suppress(OrsError):
            await self.env.request("POST", "/delete_session", sid=self.sid)
