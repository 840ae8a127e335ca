"""The Starlette app of ``tinkertrace engine``: Tinker's REST API (SDK 0.38) over the local engine.

Bodies are read and written with the SDK's own ``tinker.types`` models (JSON) and generated
protobuf messages (``forward_backward`` requests, ``ForwardBackwardOutput`` and ``SampleResponse``
results; see :mod:`.wire`), so shapes follow the pinned SDK. Training and sampling calls answer
an ``UntypedAPIFuture`` at once; ``/api/v1/retrieve_future`` long-polls for the result and answers
``try_again`` while it is not ready. Errors: HTTP status + ``{"detail": ...}`` for requests the
server refuses outright, and Tinker's ``RequestFailedResponse`` (``{"error", "category"}``) for
calls that fail while running (a bad Datum, an unknown model, a missing checkpoint).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp
from tinker import types

from tinkertrace.engine import CheckpointError, ServiceClient
from tinkertrace.engine.storage import WEIGHTS
from tinkertrace.engine_server import runs
from tinkertrace.engine_server.http import (
    USER_ERRORS,
    ApiError,
    ApiKeyMiddleware,
    error_response,
    guard,
)
from tinkertrace.engine_server.state import (
    Encoding,
    ModelSequencer,
    PendingCall,
    Sampler,
    ServerState,
    TrainingModel,
    UnknownResourceError,
)
from tinkertrace.engine_server.wire import (
    PROTO_CONTENT_TYPE,
    WireError,
    decode_forward_backward,
    decode_json_model,
    decompress,
    encode_forward_backward_output,
    encode_sample_response,
)
from tinkertrace.tokenizer import is_builtin, load_tokenizer

RETRIEVE_POLL_S = 20.0
"""How long one ``retrieve_future`` call waits for a result before answering ``try_again`` (the SDK
gives each call 45 s)."""


SESSION_TIMEOUT_S = 600.0


@dataclass
class EngineSettings:
    """How the server behaves: authentication, advertised models, long-poll time."""

    api_key: str | None = None
    """Accept exactly this key; None accepts any key that starts with ``tml-``."""
    models: list[str] = field(default_factory=list)
    """Local model folders (or built-in names) advertised by ``get_server_capabilities``."""
    retrieve_poll_s: float = RETRIEVE_POLL_S
    session_timeout_s: float = SESSION_TIMEOUT_S
    """A session without a heartbeat for this long is finished and its models released (the SDK
    sends one every 10 s while its ServiceClient lives)."""


def _map_future(source: Future[Any], fn: Callable[[Any], Any]) -> Future[Any]:
    """A future of ``fn(result)`` once ``source`` is done (its exception passes through)."""
    target: Future[Any] = Future()

    def done(f: Future[Any]) -> None:
        try:
            target.set_result(fn(f.result()))
        except Exception as exc:
            target.set_exception(exc)

    source.add_done_callback(done)
    return target


def _failed(exc: Exception) -> Future[Any]:
    future: Future[Any] = Future()
    future.set_exception(exc)
    return future


def _dump(model: Any) -> Any:
    return model.model_dump(mode="json")


class EngineApi:
    """Request handlers over one engine ``ServiceClient`` and the server's state."""

    def __init__(self, service: ServiceClient, settings: EngineSettings) -> None:
        self.service = service
        self.settings = settings
        self.state = ServerState()
        self.executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tinkertrace-engine-api")
        self.started = time.time()
        self.try_again_answers = 0
        """How many ``retrieve_future`` calls were answered ``try_again`` (results not ready yet)."""
        self._tokenizer_dirs: dict[str, str] = {}

    # -- plumbing ----------------------------------------------------------------------------

    async def _json(self, request: Request, model_cls: type[Any]) -> Any:
        try:
            payload = await request.json()
        except ValueError:
            raise ApiError(400, f"body is not JSON (expected a {model_cls.__name__})") from None
        return decode_json_model(model_cls, payload)

    def _future_response(
        self, future: Future[Any], *, encoding: Encoding = "json", model_id: str | None = None, **extra: Any
    ) -> JSONResponse:
        request_id = self.state.track(future, encoding)
        return JSONResponse(_dump(types.UntypedAPIFuture(request_id=request_id, model_id=model_id, **extra)))

    def _in_executor(self, fn: Callable[[], Any]) -> Future[Any]:
        return self.executor.submit(fn)

    # -- service -----------------------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        return JSONResponse(_dump(types.HealthResponse(status="ok")))

    async def capabilities(self, request: Request) -> Response:
        caps = self.service.get_server_capabilities()
        extra = [
            types.SupportedModel(model_name=name, trainable=True, sampleable=True)
            for name in self.settings.models
            if not is_builtin(name)
        ]
        return JSONResponse(
            _dump(types.GetServerCapabilitiesResponse(supported_models=[*caps.supported_models, *extra]))
        )

    async def client_config(self, request: Request) -> Response:
        # API keys only (no JWT exchange); uncompressed protobuf fwd/bwd; per-request future polling.
        config = types.ClientConfigResponse(pjwt_auth_enabled=False, proto_compress_fwdbwd=False)
        return JSONResponse(_dump(config))

    async def dynamic_config(self, request: Request) -> Response:
        return JSONResponse(_dump(types.ClientDynamicConfigResponse()))

    async def create_session(self, request: Request) -> Response:
        req = await self._json(request, types.CreateSessionRequest)
        session_id = self.state.new_session(
            {"tags": list(req.tags), "user_metadata": req.user_metadata, "sdk_version": req.sdk_version}
        )
        return JSONResponse(
            _dump(
                types.CreateSessionResponse(
                    session_id=session_id, info_message="tinkertrace engine: training on the local engine"
                )
            )
        )

    async def heartbeat(self, request: Request) -> Response:
        req = await self._json(request, types.SessionHeartbeatRequest)
        session = self.state.session(req.session_id)
        if session.get("finished"):
            return error_response(410, f"session {req.session_id} has finished")
        session["heartbeat"] = time.time()
        return JSONResponse(_dump(types.SessionHeartbeatResponse()))

    async def finish_session(self, request: Request) -> Response:
        """``ServiceClient.close``: the session's models and samplers are released (memory, threads)."""
        self._release(request.path_params["session_id"])
        return JSONResponse(None)

    def _release(self, session_id: str) -> None:
        for client in self.state.finish_session(session_id):
            self.executor.submit(client.close)  # finishes queued work, off the event loop

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
        return JSONResponse(_dump(types.TelemetryResponse(status="accepted")))

    # -- training ----------------------------------------------------------------------------

    def _register(
        self, model_id: str, session_id: str, client: Any, user_metadata: dict[str, Any] | None
    ) -> None:
        self.state.add_model(
            TrainingModel(
                model_id, session_id, client, ModelSequencer(next_seq_id=1), dict(user_metadata or {})
            )
        )

    async def create_model(self, request: Request) -> Response:
        req = await self._json(request, types.CreateModelRequest)
        self.state.session(req.session_id)
        model_id = f"{req.session_id}:train:{req.model_seq_id}"
        lora = req.lora_config

        def create() -> types.CreateModelResponse:
            client = self.service.create_lora_training_client(
                req.base_model,
                rank=lora.rank if lora is not None else 0,  # no LoRA config: full fine-tuning
                seed=lora.seed if lora is not None else None,
                train_mlp=lora.train_mlp if lora is not None else True,
                train_attn=lora.train_attn if lora is not None else True,
                train_unembed=lora.train_unembed if lora is not None else True,
                optimizer=req.optimizer_config,
                run_id=model_id,
            ).result()
            self._register(model_id, req.session_id, client, req.user_metadata)
            return types.CreateModelResponse(model_id=model_id)

        return self._future_response(self._in_executor(create), model_id=model_id)

    def _tokenizer_id(self, base_model: str) -> str:
        """A tokenizer the SDK's ``get_tokenizer`` can load here: the built-in one saved as a folder."""
        if not is_builtin(base_model):
            return base_model
        if base_model not in self._tokenizer_dirs:
            folder = (
                self.service.store.base_dir / "tokenizers" / base_model.replace("/", "--").replace(":", "-")
            )
            if not (folder / "tokenizer.json").is_file():
                folder.mkdir(parents=True, exist_ok=True)
                load_tokenizer(base_model).save_pretrained(str(folder))
            self._tokenizer_dirs[base_model] = str(folder.resolve())
        return self._tokenizer_dirs[base_model]

    async def get_info(self, request: Request) -> Response:
        req = await self._json(request, types.GetInfoRequest)
        info = self.state.model(req.model_id).client.get_info()
        model_data = info.model_data.model_copy(
            update={"tokenizer_id": self._tokenizer_id(info.model_data.model_name)}
        )
        return JSONResponse(_dump(info.model_copy(update={"model_data": model_data})))

    def _sequenced(
        self, model: TrainingModel, seq_id: int, start: PendingCall | Exception, encoding: Encoding = "json"
    ) -> JSONResponse:
        """Queue a call of ``model`` at ``seq_id``. A refused body (``start`` an exception) fails that
        call's future but still takes its place, so the model's later calls are not held back."""
        if isinstance(start, Exception):
            error = start

            def start() -> Future[Any]:
                raise error

        return self._future_response(
            model.sequencer.submit(seq_id, start), encoding=encoding, model_id=model.model_id
        )

    async def _model_call(
        self, request: Request, model_cls: type[Any], build: Callable[[Any, TrainingModel], PendingCall]
    ) -> JSONResponse:
        """A JSON call on a training model: validated with ``model_cls``, started by ``build(req, model)``."""
        try:
            payload = await request.json()
        except ValueError:
            raise ApiError(400, f"body is not JSON (expected a {model_cls.__name__})") from None
        if not isinstance(payload, dict):
            raise ApiError(400, f"body is not a JSON object (expected a {model_cls.__name__})")
        model = self.state.model(str(payload.get("model_id")))
        seq_id = payload.get("seq_id")
        if not isinstance(seq_id, int):
            raise ApiError(400, "seq_id is required for calls on a training model")
        try:
            start: PendingCall | Exception = build(decode_json_model(model_cls, payload), model)
        except (WireError, ApiError) as exc:
            start = exc
        return self._sequenced(model, seq_id, start)

    async def forward_backward(self, request: Request) -> Response:
        body = decompress(await request.body(), request.headers.get("content-encoding"))
        call = decode_forward_backward(body)
        model = self.state.model(call.model_id)
        method = model.client.forward if call.forward_only else model.client.forward_backward
        start = call.error or (lambda: method(call.data, call.loss_fn, call.loss_fn_config).future())
        return self._sequenced(model, call.seq_id, start, encoding="proto")

    async def optim_step(self, request: Request) -> Response:
        return await self._model_call(
            request,
            types.OptimStepRequest,
            lambda req, model: lambda: model.client.optim_step(req.optim_params).future(),
        )

    async def save_weights(self, request: Request) -> Response:
        def build(req: types.SaveWeightsRequest, model: TrainingModel) -> PendingCall:
            name = req.path or f"state-{req.seq_id:06d}"
            return lambda: model.client.save_state(
                name, overwrite=req.overwrite, user_metadata=req.user_metadata
            ).future()

        return await self._model_call(request, types.SaveWeightsRequest, build)

    async def save_weights_for_sampler(self, request: Request) -> Response:
        def build(req: types.SaveWeightsForSamplerRequest, model: TrainingModel) -> PendingCall:
            client = model.client
            if req.path is not None:
                return lambda: _map_future(
                    client.save_weights_for_sampler(req.path, user_metadata=req.user_metadata).future(),
                    lambda saved: types.SaveWeightsForSamplerResponseInternal(path=saved.path),
                )
            if req.sampling_session_seq_id is None:
                raise ApiError(400, "save_weights_for_sampler needs a path or a sampling_session_seq_id")
            sampler_id = f"{model.session_id}:sample:{req.sampling_session_seq_id}"

            def register(sampling_client: Any) -> types.SaveWeightsForSamplerResponseInternal:
                self.state.add_sampler(Sampler(sampler_id, client.spec.base_model, None, sampling_client))
                return types.SaveWeightsForSamplerResponseInternal(sampling_session_id=sampler_id)

            return lambda: _map_future(
                client.save_weights_and_get_sampling_client(kind=req.kind).future(), register
            )

        return await self._model_call(request, types.SaveWeightsForSamplerRequest, build)

    async def load_weights(self, request: Request) -> Response:
        def build(req: types.LoadWeightsRequest, model: TrainingModel) -> PendingCall:
            load = model.client.load_state_with_optimizer if req.optimizer else model.client.load_state
            return lambda: load(req.path).future()

        try:
            payload = await request.json()
        except ValueError:
            raise ApiError(400, "body is not JSON (expected a LoadWeightsRequest)") from None
        if not isinstance(payload, dict) or payload.get("session_id") is None:
            return await self._model_call(request, types.LoadWeightsRequest, build)
        # A new model created from a checkpoint: the model's first request (no create_model).
        req = decode_json_model(types.LoadWeightsRequest, payload)
        self.state.session(req.session_id)
        if req.model_seq_id is None:
            raise ApiError(400, "load_weights with session_id needs model_seq_id")
        model_id = f"{req.session_id}:train:{req.model_seq_id}"

        def create() -> types.LoadWeightsResponse:
            if req.optimizer:
                made = self.service.create_training_client_from_state_with_optimizer(
                    req.path, req.base_model, run_id=model_id
                )
            else:
                made = self.service.create_training_client_from_state(
                    req.path, req.base_model, optimizer=req.optimizer_config, run_id=model_id
                )
            self._register(model_id, req.session_id, made.result(), req.user_metadata)
            return types.LoadWeightsResponse(path=req.path, model_id=model_id)

        return self._future_response(self._in_executor(create), model_id=model_id)

    # -- sampling ----------------------------------------------------------------------------

    async def create_sampling_session(self, request: Request) -> Response:
        req = await self._json(request, types.CreateSamplingSessionRequest)
        self.state.session(req.session_id)
        sampler_id = f"{req.session_id}:sample:{req.sampling_session_seq_id}"
        made = await asyncio.wrap_future(
            self._in_executor(
                lambda: self.service.create_sampling_client(
                    model_path=req.model_path, base_model=req.base_model
                ).result()
            )
        )
        self.state.add_sampler(Sampler(sampler_id, made.get_base_model(), req.model_path, made))
        return JSONResponse(_dump(types.CreateSamplingSessionResponse(sampling_session_id=sampler_id)))

    async def join_sampling_session(self, request: Request) -> Response:
        req = await self._json(request, types.JoinSamplingSessionRequest)
        sampler = self.state.sampler(req.sampling_session_id)
        sampler.clones += 1
        return JSONResponse(_dump(types.JoinSamplingSessionResponse(client_counter=sampler.clones)))

    async def get_sampler(self, request: Request) -> Response:
        sampler = self.state.sampler(request.path_params["sampler_id"])
        return JSONResponse(
            _dump(
                types.GetSamplerResponse(
                    sampler_id=sampler.sampler_id,
                    base_model=sampler.base_model,
                    model_path=sampler.model_path,
                )
            )
        )

    async def asample(self, request: Request) -> Response:
        req = await self._json(request, types.SampleRequest)
        if req.sampling_session_id is None:
            raise ApiError(400, "asample needs a sampling_session_id (create a sampling client first)")
        sampler = self.state.sampler(req.sampling_session_id)
        try:
            future = sampler.client.sample(
                req.prompt,
                req.num_samples,
                req.sampling_params,
                include_prompt_logprobs=bool(req.prompt_logprobs),
                topk_prompt_logprobs=req.topk_prompt_logprobs,
                topk_sample_logprobs=req.topk_sample_logprobs,
                target_prompt_logprobs=req.target_prompt_logprobs,  # type: ignore[arg-type]
                prompt_alt_tokens_k=req.prompt_alt_tokens_k,
                prompt_logprobs_last_n=req.prompt_logprobs_last_n,
            ).future()
        except USER_ERRORS as exc:  # refused up front (an image chunk, top-k logprobs, ...)
            future = _failed(exc)
        sequence_ids = [uuid.uuid4().hex for _ in range(req.num_samples)]
        return self._future_response(future, encoding="proto", sample_sequence_ids=sequence_ids)

    # -- futures -----------------------------------------------------------------------------

    async def retrieve_future(self, request: Request) -> Response:
        req = await self._json(request, types.FutureRetrieveRequest)
        pending = self.state.result(req.request_id)
        if not pending.future.done():
            await asyncio.wait([asyncio.wrap_future(pending.future)], timeout=self.settings.retrieve_poll_s)
        if not pending.future.done():
            self.try_again_answers += 1
            return JSONResponse(
                _dump(types.TryAgainResponse(request_id=req.request_id, queue_state="active"))
            )
        self.state.forget(req.request_id)
        exc = pending.future.exception()
        if exc is not None:
            category = (
                types.RequestErrorCategory.User
                if isinstance(exc, USER_ERRORS)
                else types.RequestErrorCategory.Server
            )
            failed = types.RequestFailedResponse(error=f"{type(exc).__name__}: {exc}", category=category)
            return JSONResponse(_dump(failed))
        result = pending.future.result()
        if pending.encoding == "proto":
            encode = (
                encode_sample_response
                if isinstance(result, types.SampleResponse)
                else encode_forward_backward_output
            )
            return Response(encode(result), media_type=PROTO_CONTENT_TYPE)
        return JSONResponse(_dump(result))

    async def cancel_future(self, request: Request) -> Response:
        payload = await request.json()
        self.state.cancel(str(payload.get("request_id", "")))
        return JSONResponse(None)

    # -- REST: runs and checkpoints ----------------------------------------------------------

    def _run(self, run_id: str) -> types.TrainingRun:
        model = self.state.models.get(run_id)
        spec = model.client.spec.to_dict() if model is not None else runs.run_spec(self.service.store, run_id)
        if spec is None:
            raise UnknownResourceError(f"unknown training run {run_id!r}")
        last = datetime.fromtimestamp(model.last_request if model else self.started, tz=UTC)
        return runs.training_run(run_id, spec, runs.list_checkpoints(self.service.store, run_id), last)

    async def get_training_run(self, request: Request) -> Response:
        return JSONResponse(_dump(self._run(request.path_params["run_id"])))

    async def list_training_runs(self, request: Request) -> Response:
        base = self.service.store.base_dir
        ids = sorted(
            {p.name for p in base.glob("*") if p.is_dir() and (p / WEIGHTS).is_dir()} | set(self.state.models)
        )
        limit = int(request.query_params.get("limit", 20))
        offset = int(request.query_params.get("offset", 0))
        page = [self._run(run_id) for run_id in ids[offset : offset + limit]]
        cursor = types.Cursor(offset=offset, limit=limit, total_count=len(ids))
        return JSONResponse(_dump(types.TrainingRunsResponse(training_runs=page, cursor=cursor)))

    async def list_checkpoints(self, request: Request) -> Response:
        run = self._run(request.path_params["run_id"])
        checkpoints = runs.list_checkpoints(self.service.store, run.training_run_id)
        return JSONResponse(_dump(types.CheckpointsListResponse(checkpoints=checkpoints)))

    async def weights_info(self, request: Request) -> Response:
        payload = await request.json()
        try:
            _, meta = self.service.store.resolve(str(payload.get("tinker_path")))
        except CheckpointError as exc:
            raise UnknownResourceError(str(exc)) from None
        return JSONResponse(_dump(runs.weights_info(meta)))

    async def billing_usage(self, request: Request) -> Response:
        """Nothing is billed locally: no usage events."""
        return JSONResponse(_dump(types.BillingUsageResponse(data=[])))

    async def checkpoint_storage(self, request: Request) -> Response:
        """What the engine folder's checkpoints occupy (no cost: nothing is billed locally)."""
        count, size = runs.storage_usage(self.service.store)
        item = types.CurrentCheckpointStorageUsageItem(
            checkpoint_count=count, size_bytes=size, size_gigabytes=size / 1e9
        )
        return JSONResponse(_dump(types.CurrentCheckpointStorageUsageResponse(data=[item])))

    async def unsupported(self, request: Request) -> Response:
        return error_response(
            404,
            f"{request.method} {request.url.path} is not served by tinkertrace engine (see docs/engine.md)",
        )


def create_app(service: ServiceClient, settings: EngineSettings | None = None) -> ASGIApp:
    """The ASGI app serving ``service`` over Tinker's API (wrapped in the API-key check)."""
    settings = settings or EngineSettings()
    api = EngineApi(service, settings)
    v1 = "/api/v1"
    table: list[tuple[str, Callable[[Request], Awaitable[Response]], list[str]]] = [
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
        ("/weights_info", api.weights_info, ["POST"]),
        ("/billing/usage/events", api.billing_usage, ["GET"]),
        ("/billing/usage/checkpoints/current", api.checkpoint_storage, ["GET"]),
        ("/{rest:path}", api.unsupported, ["GET", "POST", "PUT", "DELETE", "PATCH"]),
    ]
    routes = [Route(v1 + path, guard(handler), methods=methods) for path, handler, methods in table]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        reaper = asyncio.create_task(api.expire_sessions())
        yield
        reaper.cancel()
        api.executor.shutdown(wait=False, cancel_futures=True)

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.api = api
    return ApiKeyMiddleware(app, settings.api_key)
