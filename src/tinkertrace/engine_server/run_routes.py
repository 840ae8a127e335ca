"""REST routes of ``tinkertrace engine`` over the engine folder: training runs, checkpoints (listing,
deletion, expiry), exported weights and their download URLs, weights info, and the billing routes
(nothing is billed locally)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from tinker import types

from tinkertrace.engine import CheckpointError
from tinkertrace.engine.storage import EXTERNAL_WEIGHTS, make_path
from tinkertrace.engine_server import runs
from tinkertrace.engine_server.core import EngineCore, dump
from tinkertrace.engine_server.downloads import export_files
from tinkertrace.engine_server.http import ApiError, log
from tinkertrace.engine_server.state import UnknownResourceError


class RunRoutes(EngineCore):
    def _record(self, run_id: str) -> dict[str, Any]:
        """The run's record (spec, model name, user_metadata); UnknownResourceError if there is none."""
        record = runs.run_record(self.service.store, run_id)
        if record is None:
            raise UnknownResourceError(f"unknown training run {run_id!r}")
        return record

    def _run(self, run_id: str) -> types.TrainingRun:
        record = self._record(run_id)
        model = self.state.models.get(run_id)
        last = datetime.fromtimestamp(model.last_request if model else self.started, tz=UTC)
        return runs.training_run(run_id, record, runs.list_checkpoints(self.service.store, run_id), last)

    async def get_training_run(self, request: Request) -> Response:
        return JSONResponse(dump(self._run(request.path_params["run_id"])))

    async def list_training_runs(self, request: Request) -> Response:
        ids = runs.run_ids(self.service.store)
        limit = int(request.query_params.get("limit", 20))
        offset = int(request.query_params.get("offset", 0))
        page = [self._run(run_id) for run_id in ids[offset : offset + limit]]
        cursor = types.Cursor(offset=offset, limit=limit, total_count=len(ids))
        return JSONResponse(dump(types.TrainingRunsResponse(training_runs=page, cursor=cursor)))

    async def list_checkpoints(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        self._record(run_id)  # an unknown run is an error, not an empty list
        checkpoints = runs.list_checkpoints(self.service.store, run_id)
        return JSONResponse(dump(types.CheckpointsListResponse(checkpoints=checkpoints)))

    def _checkpoint_path(self, request: Request) -> str:
        """The ``tinker://<run>/<kind>/<name>`` path a ``.../checkpoints/{kind}/{name}`` route names."""
        params = request.path_params
        return make_path(params["run_id"], params["kind"], params["name"])

    async def delete_checkpoint(self, request: Request) -> Response:
        """``RestClient.delete_checkpoint``: the checkpoint's folder is removed."""
        path = self._checkpoint_path(request)
        await asyncio.to_thread(self.service.store.delete, path)
        log.info("deleted checkpoint %s", path)
        return JSONResponse(None)

    async def set_checkpoint_ttl(self, request: Request) -> Response:
        """``RestClient.set_checkpoint_ttl_from_tinker_path``: expire in ``ttl_seconds`` (null: never)."""
        payload = await request.json()
        if not isinstance(payload, dict) or "ttl_seconds" not in payload:
            raise ApiError(400, 'body must be {"ttl_seconds": <seconds or null>}')
        self.service.store.set_ttl(self._checkpoint_path(request), payload["ttl_seconds"])
        return JSONResponse(None)

    async def external_weights_urls(self, request: Request) -> Response:
        """``RestClient.get_external_weights_urls``: one signed URL per file of an export."""
        params = request.path_params
        if params["kind"] != EXTERNAL_WEIGHTS:
            raise ApiError(400, "download URLs are served for external_weights checkpoints only")
        folder, _ = self.service.store.resolve(self._checkpoint_path(request))
        files = export_files(folder)
        urls, expires = self.downloads.urls(str(request.base_url), params["run_id"], params["name"], files)
        answer = types.ExternalWeightsUrlsResponse(urls=urls, expires=datetime.fromtimestamp(expires, tz=UTC))
        return JSONResponse(dump(answer))

    async def download(self, request: Request) -> Response:
        """One file of an export, for a URL from ``external_weights_urls`` (no API key: the URL is signed)."""
        params, query = request.path_params, request.query_params
        run_id, name, file = params["run_id"], params["name"], params["file"]
        refused = self.downloads.check(
            run_id, name, file, query.get("expires", ""), query.get("signature", "")
        )
        if refused is not None:
            raise ApiError(403, refused)
        folder, _ = self.service.store.resolve(make_path(run_id, EXTERNAL_WEIGHTS, name))
        if file not in export_files(folder):
            raise UnknownResourceError(
                f"{file!r} is not a file of tinker://{run_id}/{EXTERNAL_WEIGHTS}/{name}"
            )
        return FileResponse(folder / file, media_type="application/octet-stream")

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

    async def sweep_checkpoints(self) -> None:
        """Forever: delete checkpoints whose TTL has passed (at start, then every ``checkpoint_sweep_s``)."""
        while True:
            try:
                for path in await asyncio.to_thread(self.service.store.sweep_expired):
                    log.info("deleted expired checkpoint %s", path)
            except OSError as exc:
                log.warning("sweeping expired checkpoints failed: %s", exc)
            await asyncio.sleep(self.settings.checkpoint_sweep_s)

    async def unsupported(self, request: Request) -> Response:
        raise ApiError(
            404,
            f"{request.method} {request.url.path} is not served by tinkertrace engine (see docs/engine.md)",
        )
