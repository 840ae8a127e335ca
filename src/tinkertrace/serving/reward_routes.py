"""The rollout routes of a recording endpoint: a reward posted over HTTP, and a rollout's end."""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tinkertrace.serving.guard import Handler
from tinkertrace.serving.openai_wire.errors import ApiError, read_json, require_object
from tinkertrace.serving.recording import CallRecorder


def rollout_routes(recorder: CallRecorder | None, guard: Callable[[Handler], Handler]) -> list[Route]:
    """``POST /v1/rollouts/{id}/reward`` and ``/finish`` (each behind ``guard``): a reward span from
    ``{"value", "name"?, "primary"?, "response_id"?}``, the rollout's end from ``{"status"?}``. Without
    a recorder they answer 404, saying how to turn recording on."""

    def recording() -> CallRecorder:
        if recorder is None:
            raise ApiError(
                404,
                "Recording is off: start with --collector URL or --spans-dir DIR to record calls, rewards "
                "and rollouts.",
                code="recording_disabled",
            )
        return recorder

    async def reward(request: Request) -> Response:
        body = require_object(await read_json(request))
        with recording().journal.capture() as durable:
            answer = recording().reward(request.path_params["rollout_id"], body)
        await recording().stored(durable)
        return JSONResponse(answer)

    async def finish(request: Request) -> Response:
        body = require_object(await read_json(request)) if (await request.body()).strip() else {}
        with recording().journal.capture() as durable:
            answer = recording().finish(request.path_params["rollout_id"], body)
        await recording().stored(durable)
        return JSONResponse(answer)

    return [
        Route("/v1/rollouts/{rollout_id}/reward", guard(reward), methods=["POST"]),
        Route("/v1/rollouts/{rollout_id}/finish", guard(finish), methods=["POST"]),
    ]
