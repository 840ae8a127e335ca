"""The Starlette app of ``tinkertrace engine``: Tinker's REST API (SDK 0.38) over the local engine.

Bodies are read and written with the SDK's own ``tinker.types`` models (JSON) and generated
protobuf messages (``forward_backward`` requests, ``ForwardBackwardOutput`` and ``SampleResponse``
results; see :mod:`.wire`), so shapes follow the pinned SDK. Training and sampling calls answer
an ``UntypedAPIFuture`` at once; ``/api/v1/retrieve_future`` long-polls for the result and answers
``try_again`` while it is not ready. Errors: HTTP status + ``{"detail": ...}`` for requests the
server refuses outright, and Tinker's ``RequestFailedResponse`` (``{"error", "category"}``) for
calls that fail while running (a bad Datum, an unknown model, a missing checkpoint).

The handlers live with their resource: :mod:`.session_routes`, :mod:`.training_routes`,
:mod:`.sampling_routes`, :mod:`.future_routes`, :mod:`.run_routes`; the table below lists every URL.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from tinkertrace.engine import ServiceClient
from tinkertrace.engine_server.core import EngineSettings
from tinkertrace.engine_server.future_routes import FutureRoutes
from tinkertrace.engine_server.http import ApiKeyMiddleware, guard
from tinkertrace.engine_server.run_routes import RunRoutes
from tinkertrace.engine_server.sampling_routes import SamplingRoutes
from tinkertrace.engine_server.session_routes import SessionRoutes
from tinkertrace.engine_server.training_routes import TrainingRoutes

__all__ = ["EngineApi", "EngineSettings", "create_app"]


class EngineApi(SessionRoutes, TrainingRoutes, SamplingRoutes, FutureRoutes, RunRoutes):
    """Every request handler, over one engine ``ServiceClient`` and the server's state."""


def _routes(api: EngineApi) -> list[tuple[str, Callable[[Request], Awaitable[Response]], list[str]]]:
    """``(path under /api/v1, handler, methods)`` of every route, in Tinker's API order."""
    return [
        ("/healthz", api.healthz, ["GET"]),
        ("/get_server_capabilities", api.capabilities, ["GET"]),
        ("/client/config", api.client_config, ["POST"]),
        ("/client/dynamic_config", api.dynamic_config, ["POST"]),
        ("/create_session", api.create_session, ["POST"]),
        ("/session_heartbeat", api.heartbeat, ["POST"]),
        ("/sessions/{session_id}/finish", api.finish_session, ["POST"]),
        ("/telemetry", api.accepted, ["POST"]),
        ("/create_model", api.create_model, ["POST"]),
        ("/get_info", api.get_info, ["POST"]),
        ("/forward_backward", api.forward_backward, ["POST"]),
        ("/optim_step", api.optim_step, ["POST"]),
        ("/save_weights", api.save_weights, ["POST"]),
        ("/save_weights_for_sampler", api.save_weights_for_sampler, ["POST"]),
        ("/save_weights_external", api.save_weights_external, ["POST"]),
        ("/load_weights", api.load_weights, ["POST"]),
        ("/create_sampling_session", api.create_sampling_session, ["POST"]),
        ("/join_sampling_session", api.join_sampling_session, ["POST"]),
        ("/samplers/{sampler_id}", api.get_sampler, ["GET"]),
        ("/asample", api.asample, ["POST"]),
        ("/retrieve_future", api.retrieve_future, ["POST"]),
        ("/cancel_future", api.cancel_future, ["POST"]),
        ("/training_runs", api.list_training_runs, ["GET"]),
        ("/training_runs/{run_id}", api.get_training_run, ["GET"]),
        ("/training_runs/{run_id}/checkpoints", api.list_checkpoints, ["GET"]),
        ("/training_runs/{run_id}/checkpoints/{kind}/{name}", api.delete_checkpoint, ["DELETE"]),
        ("/training_runs/{run_id}/checkpoints/{kind}/{name}/ttl", api.set_checkpoint_ttl, ["PUT"]),
        (
            "/training_runs/{run_id}/checkpoints/{kind}/{name}/external_weights_urls",
            api.external_weights_urls,
            ["GET"],
        ),
        ("/downloads/{run_id}/{name}/{file:path}", api.download, ["GET"]),
        ("/weights_info", api.weights_info, ["POST"]),
        ("/billing/usage/events", api.billing_usage, ["GET"]),
        ("/billing/usage/checkpoints/current", api.checkpoint_storage, ["GET"]),
        ("/{rest:path}", api.unsupported, ["GET", "POST", "PUT", "DELETE", "PATCH"]),
    ]


def create_app(service: ServiceClient, settings: EngineSettings | None = None) -> ASGIApp:
    """The ASGI app serving ``service`` over Tinker's API (wrapped in the API-key check)."""
    api = EngineApi(service, settings or EngineSettings())
    routes = [
        Route("/api/v1" + path, guard(handler), methods=methods) for path, handler, methods in _routes(api)
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(api.expire_sessions()), asyncio.create_task(api.sweep_checkpoints())]
        yield
        for task in tasks:
            task.cancel()
        api.executor.shutdown(wait=False, cancel_futures=True)

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.api = api
    return ApiKeyMiddleware(app, api.settings.api_key)
