"""REST routes of ``tinkertrace engine`` over the engine folder: training runs, checkpoints, weights
info, and the billing routes (nothing is billed locally)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from tinker import types

from tinkertrace.engine import CheckpointError
from tinkertrace.engine.storage import WEIGHTS
from tinkertrace.engine_server import runs
from tinkertrace.engine_server.core import EngineCore, dump
from tinkertrace.engine_server.http import error_response
from tinkertrace.engine_server.state import UnknownResourceError


class RunRoutes(EngineCore):
    def _spec(self, run_id: str) -> dict[str, Any]:
        """The run's spec (of a live model, else from its stored weights); UnknownResourceError if none."""
        model = self.state.models.get(run_id)
        spec = model.client.spec.to_dict() if model is not None else runs.run_spec(self.service.store, run_id)
        if spec is None:
            raise UnknownResourceError(f"unknown training run {run_id!r}")
        return spec

    def _run(self, run_id: str) -> types.TrainingRun:
        spec = self._spec(run_id)
        model = self.state.models.get(run_id)
        last = datetime.fromtimestamp(model.last_request if model else self.started, tz=UTC)
        return runs.training_run(run_id, spec, runs.list_checkpoints(self.service.store, run_id), last)

    async def get_training_run(self, request: Request) -> Response:
        return JSONResponse(dump(self._run(request.path_params["run_id"])))

    async def list_training_runs(self, request: Request) -> Response:
        base = self.service.store.base_dir
        ids = sorted(
            {p.name for p in base.glob("*") if p.is_dir() and (p / WEIGHTS).is_dir()} | set(self.state.models)
        )
        limit = int(request.query_params.get("limit", 20))
        offset = int(request.query_params.get("offset", 0))
        page = [self._run(run_id) for run_id in ids[offset : offset + limit]]
        cursor = types.Cursor(offset=offset, limit=limit, total_count=len(ids))
        return JSONResponse(dump(types.TrainingRunsResponse(training_runs=page, cursor=cursor)))

    async def list_checkpoints(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        self._spec(run_id)  # an unknown run is an error, not an empty list
        checkpoints = runs.list_checkpoints(self.service.store, run_id)
        return JSONResponse(dump(types.CheckpointsListResponse(checkpoints=checkpoints)))

    async def weights_info(self, request: Request) -> Response:
        payload = await request.json()
        try:
            _, meta = self.service.store.resolve(str(payload.get("tinker_path")))
        except CheckpointError as exc:
            raise UnknownResourceError(str(exc)) from None
        return JSONResponse(dump(runs.weights_info(meta)))

    async def billing_usage(self, request: Request) -> Response:
        """Nothing is billed locally: no usage events."""
        return JSONResponse(dump(types.BillingUsageResponse(data=[])))

    async def checkpoint_storage(self, request: Request) -> Response:
        """What the engine folder's checkpoints occupy (no cost: nothing is billed locally)."""
        count, size = runs.storage_usage(self.service.store)
        item = types.CurrentCheckpointStorageUsageItem(
            checkpoint_count=count, size_bytes=size, size_gigabytes=size / 1e9
        )
        return JSONResponse(dump(types.CurrentCheckpointStorageUsageResponse(data=[item])))

    async def unsupported(self, request: Request) -> Response:
        return error_response(
            404,
            f"{request.method} {request.url.path} is not served by tinkertrace engine (see docs/engine.md)",
        )
