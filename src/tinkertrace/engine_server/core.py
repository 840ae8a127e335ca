"""What every route of ``tinkertrace engine`` shares: settings, state, the executor, body reading.

The routes are grouped by resource in :mod:`.session_routes`, :mod:`.training_routes`,
:mod:`.sampling_routes`, :mod:`.future_routes` and :mod:`.run_routes`; :mod:`.app` joins them and
lists the URLs.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from tinker import types

from tinkertrace.engine import ServiceClient
from tinkertrace.engine_server.downloads import DownloadSigner
from tinkertrace.engine_server.http import ApiError, log
from tinkertrace.engine_server.settings import EngineSettings
from tinkertrace.engine_server.state import Encoding, ServerState
from tinkertrace.engine_server.wire import decode_json_model


def dump(model: Any) -> Any:
    """A ``tinker.types`` model as JSON-ready data."""
    return model.model_dump(mode="json")


class EngineCore:
    """One engine ``ServiceClient`` and the server's state, shared by the route groups."""

    def __init__(self, service: ServiceClient, settings: EngineSettings) -> None:
        self.service = service
        self.settings = settings
        self.state = ServerState()
        self.executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tinkertrace-engine-api")
        self.started = time.time()
        self.downloads = DownloadSigner()
        self.try_again_answers = 0
        """How many ``retrieve_future`` calls were answered ``try_again`` (results not ready yet)."""
        self._tokenizer_dirs: dict[str, str] = {}

    async def _body(self, request: Request, model_cls: type[Any]) -> Any:
        """The JSON body of a request meant to be a ``model_cls``; 400 when it is not JSON."""
        try:
            return await request.json()
        except ValueError:
            raise ApiError(400, f"body is not JSON (expected a {model_cls.__name__})") from None

    async def _json(self, request: Request, model_cls: type[Any]) -> Any:
        """The body as a validated ``model_cls`` (a ``tinker.types`` request)."""
        return decode_json_model(model_cls, await self._body(request, model_cls))

    def resolve_model(self, name: str) -> str:
        """The local model behind a model name a client asked for (``--model-alias``), else the name."""
        return self.settings.model_aliases.get(name, name)

    def _future_response(
        self,
        request: Request,
        future: Future[Any],
        *,
        encoding: Encoding = "json",
        model_id: str | None = None,
        **extra: Any,
    ) -> JSONResponse:
        """Track ``future`` and answer its request id (``UntypedAPIFuture``) at once; a call that
        fails is logged with its route when it fails."""
        request_id = self.state.track(future, encoding)
        route = f"{request.method} {request.url.path}"
        future.add_done_callback(lambda done: _log_failure(route, request_id, done))
        return JSONResponse(dump(types.UntypedAPIFuture(request_id=request_id, model_id=model_id, **extra)))

    def _release(self, session_id: str) -> None:
        """Finish a session: its models and samplers are closed (finishing queued work) off the loop."""
        for client in self.state.finish_session(session_id):
            self.executor.submit(client.close)


def _log_failure(route: str, request_id: str, future: Future[Any]) -> None:
    if not future.cancelled() and future.exception() is not None:
        exc = future.exception()
        log.warning("%s failed (%s): %s: %s", route, request_id, type(exc).__name__, exc)
