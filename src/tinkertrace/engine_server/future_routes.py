"""Future routes of ``tinkertrace engine``: the long poll for a call's result, and cancelling it.

``retrieve_future`` waits up to ``retrieve_poll_s`` and answers ``try_again`` while the result is
not ready; a failed call answers Tinker's ``RequestFailedResponse`` (category ``user`` for the
caller's mistakes, else ``server``); ``forward_backward`` and sample results go out as protobuf.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from tinker import types
from tinker.types.try_again_response import TryAgainResponse  # not exported by tinker.types

from tinkertrace.engine_server.core import EngineCore, dump
from tinkertrace.engine_server.http import USER_ERRORS
from tinkertrace.engine_server.wire import (
    PROTO_CONTENT_TYPE,
    encode_forward_backward_output,
    encode_sample_response,
)


class FutureRoutes(EngineCore):
    async def retrieve_future(self, request: Request) -> Response:
        req = await self._json(request, types.FutureRetrieveRequest)
        pending = self.state.result(req.request_id)
        if not pending.future.done():
            await asyncio.wait([asyncio.wrap_future(pending.future)], timeout=self.settings.retrieve_poll_s)
        if not pending.future.done():
            self.try_again_answers += 1
            return JSONResponse(dump(TryAgainResponse(request_id=req.request_id, queue_state="active")))
        self.state.forget(req.request_id)
        exc = pending.future.exception()
        if exc is not None:
            user = isinstance(exc, USER_ERRORS)
            category = types.RequestErrorCategory.User if user else types.RequestErrorCategory.Server
            failed = types.RequestFailedResponse(error=f"{type(exc).__name__}: {exc}", category=category)
            return JSONResponse(dump(failed))
        result = pending.future.result()
        if pending.encoding == "proto":
            if isinstance(result, types.SampleResponse):
                return Response(encode_sample_response(result), media_type=PROTO_CONTENT_TYPE)
            return Response(encode_forward_backward_output(result), media_type=PROTO_CONTENT_TYPE)
        return JSONResponse(dump(result))

    async def cancel_future(self, request: Request) -> Response:
        payload = await request.json()
        self.state.cancel(str(payload.get("request_id", "")))
        return JSONResponse(None)
