"""Service and session routes of ``tinkertrace engine``: health, capabilities, client config,
sessions and their heartbeats, telemetry."""

from __future__ import annotations

import asyncio
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from tinker import types

from tinkertrace.engine_server.core import EngineCore, dump
from tinkertrace.engine_server.http import error_response
from tinkertrace.models.tokenizer import is_builtin


class SessionRoutes(EngineCore):
    async def healthz(self, request: Request) -> Response:
        return JSONResponse(dump(types.HealthResponse(status="ok")))

    async def capabilities(self, request: Request) -> Response:
        caps = self.service.get_server_capabilities()
        names = [name for name in self.settings.models if not is_builtin(name)] + list(
            self.settings.model_aliases
        )
        extra = [types.SupportedModel(model_name=name, trainable=True, sampleable=True) for name in names]
        return JSONResponse(
            dump(types.GetServerCapabilitiesResponse(supported_models=[*caps.supported_models, *extra]))
        )

    async def client_config(self, request: Request) -> Response:
        # API keys only (no JWT exchange); uncompressed protobuf fwd/bwd; per-request future polling.
        config = types.ClientConfigResponse(pjwt_auth_enabled=False, proto_compress_fwdbwd=False)
        return JSONResponse(dump(config))

    async def dynamic_config(self, request: Request) -> Response:
        return JSONResponse(dump(types.ClientDynamicConfigResponse()))

    async def create_session(self, request: Request) -> Response:
        req = await self._json(request, types.CreateSessionRequest)
        session_id = self.state.new_session(
            {"tags": list(req.tags), "user_metadata": req.user_metadata, "sdk_version": req.sdk_version}
        )
        info = "tinkertrace engine: training on the local engine"
        return JSONResponse(dump(types.CreateSessionResponse(session_id=session_id, info_message=info)))

    async def heartbeat(self, request: Request) -> Response:
        req = await self._json(request, types.SessionHeartbeatRequest)
        session = self.state.session(req.session_id)
        if session.get("finished"):
            return error_response(410, f"session {req.session_id} has finished", "POST " + request.url.path)
        session["heartbeat"] = time.time()
        return JSONResponse(dump(types.SessionHeartbeatResponse()))

    async def finish_session(self, request: Request) -> Response:
        """``ServiceClient.close``: the session's models and samplers are released (memory, threads)."""
        self._release(request.path_params["session_id"])
        return JSONResponse(None)

    async def expire_sessions(self) -> None:
        """Forever: finish sessions whose client stopped sending heartbeats (it crashed or was killed)."""
        timeout = self.settings.session_timeout_s
        while True:
            await asyncio.sleep(min(60.0, timeout / 4))
            now = time.time()
            for session_id, session in list(self.state.sessions.items()):
                if not session.get("finished") and now - session["heartbeat"] > timeout:
                    self._release(session_id)

    async def accepted(self, request: Request) -> Response:
        """Telemetry: accepted and dropped (nothing leaves this machine)."""
        await request.body()
        return JSONResponse(dump(types.TelemetryResponse(status="accepted")))
