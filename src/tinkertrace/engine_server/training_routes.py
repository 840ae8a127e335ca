"""Training routes of ``tinkertrace engine``: creating and loading training models, and their
sequenced calls (``forward_backward``, ``optim_step``, saving weights).

The calls of one model carry a ``seq_id`` and run in that order (:class:`.state.ModelSequencer`); a
body refused before it runs still takes its place in the sequence, so later calls are not held back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from tinker import types

from tinkertrace.engine.training import TrainingClient
from tinkertrace.engine_server.core import EngineCore, dump
from tinkertrace.engine_server.http import ApiError
from tinkertrace.engine_server.state import (
    Encoding,
    ModelSequencer,
    PendingCall,
    Sampler,
    TrainingModel,
)
from tinkertrace.engine_server.wire import WireError, decode_forward_backward, decode_json_model, decompress
from tinkertrace.futures import failed, map_future
from tinkertrace.models.catalog import model_folder
from tinkertrace.models.tokenizer import is_builtin, load_tokenizer


class TrainingRoutes(EngineCore):
    def _register(self, model_id: str, session_id: str, client: TrainingClient) -> None:
        sequencer = ModelSequencer(next_seq_id=1)
        self.state.add_model(TrainingModel(model_id, session_id, client, sequencer))

    async def create_model(self, request: Request) -> Response:
        req = await self._json(request, types.CreateModelRequest)
        self.state.session(req.session_id)
        model_id = f"{req.session_id}:train:{req.model_seq_id}"
        lora = req.lora_config

        def create() -> types.CreateModelResponse:
            client = self.service.create_lora_training_client(
                self.resolve_model(req.base_model),
                rank=lora.rank if lora is not None else 0,  # no LoRA config: full fine-tuning
                seed=lora.seed if lora is not None else None,
                train_mlp=lora.train_mlp if lora is not None else True,
                train_attn=lora.train_attn if lora is not None else True,
                train_unembed=lora.train_unembed if lora is not None else True,
                user_metadata=req.user_metadata,
                optimizer=req.optimizer_config,
                run_id=model_id,
                model_name=req.base_model,
            ).result()
            self._register(model_id, req.session_id, client)
            return types.CreateModelResponse(model_id=model_id)

        return self._future_response(request, self.executor.submit(create), model_id=model_id)

    def _tokenizer_id(self, base_model: str) -> str:
        """A tokenizer the SDK's ``get_tokenizer`` can load here: the built-in one saved as a folder, a
        named or GGUF model's converted folder."""
        if not is_builtin(base_model):
            return str(model_folder(base_model).resolve())
        if base_model not in self._tokenizer_dirs:
            name = base_model.replace("/", "--").replace(":", "-")
            folder = self.service.store.base_dir / "tokenizers" / name
            if not (folder / "tokenizer.json").is_file():
                folder.mkdir(parents=True, exist_ok=True)
                load_tokenizer(base_model).save_pretrained(str(folder))
            self._tokenizer_dirs[base_model] = str(folder.resolve())
        return self._tokenizer_dirs[base_model]

    async def get_info(self, request: Request) -> Response:
        req = await self._json(request, types.GetInfoRequest)
        client = self.state.model(req.model_id).client
        info = client.get_info()
        model_data = info.model_data.model_copy(
            update={"tokenizer_id": self._tokenizer_id(client.spec.base_model)}
        )
        return JSONResponse(dump(info.model_copy(update={"model_data": model_data})))

    def _sequenced(
        self,
        request: Request,
        model: TrainingModel,
        seq_id: int,
        start: PendingCall,
        encoding: Encoding = "json",
    ) -> JSONResponse:
        """Queue a call of ``model`` at ``seq_id``. A refused body starts as a failed future but still
        takes its place, so the model's later calls are not held back."""
        return self._future_response(
            request, model.sequencer.submit(seq_id, start), encoding=encoding, model_id=model.model_id
        )

    async def _model_call(
        self, request: Request, model_cls: type[Any], build: Callable[[Any, TrainingModel], PendingCall]
    ) -> JSONResponse:
        """A JSON call on a training model: validated with ``model_cls``, started by ``build(req, model)``."""
        payload = await self._body(request, model_cls)
        if not isinstance(payload, dict):
            raise ApiError(400, f"body is not a JSON object (expected a {model_cls.__name__})")
        model = self.state.model(str(payload.get("model_id")))
        seq_id = payload.get("seq_id")
        if not isinstance(seq_id, int):
            raise ApiError(400, "seq_id is required for calls on a training model")
        try:
            start = build(decode_json_model(model_cls, payload), model)
        except (WireError, ApiError) as exc:
            start = functools.partial(failed, exc)
        return self._sequenced(request, model, seq_id, start)

    async def forward_backward(self, request: Request) -> Response:
        body = decompress(await request.body(), request.headers.get("content-encoding"))
        call = decode_forward_backward(body)
        model = self.state.model(call.model_id)
        method = model.client.forward if call.forward_only else model.client.forward_backward
        if call.error is not None:
            start: PendingCall = functools.partial(failed, call.error)
        else:
            start = lambda: method(call.data, call.loss_fn, call.loss_fn_config).future()  # noqa: E731
        return self._sequenced(request, model, call.seq_id, start, encoding="proto")

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
                name, ttl_seconds=req.ttl_seconds, overwrite=req.overwrite, user_metadata=req.user_metadata
            ).future()

        return await self._model_call(request, types.SaveWeightsRequest, build)

    async def save_weights_for_sampler(self, request: Request) -> Response:
        def build(req: types.SaveWeightsForSamplerRequest, model: TrainingModel) -> PendingCall:
            client = model.client
            if (path := req.path) is not None:
                return lambda: map_future(
                    client.save_weights_for_sampler(
                        path, ttl_seconds=req.ttl_seconds, user_metadata=req.user_metadata
                    ).future(),
                    lambda saved: types.SaveWeightsForSamplerResponseInternal(path=saved.path),
                )
            if req.sampling_session_seq_id is None:
                raise ApiError(400, "save_weights_for_sampler needs a path or a sampling_session_seq_id")
            sampler_id = f"{model.session_id}:sample:{req.sampling_session_seq_id}"

            def register(sampling_client: Any) -> types.SaveWeightsForSamplerResponseInternal:
                self.state.add_sampler(Sampler(sampler_id, client.model_name, None, sampling_client))
                return types.SaveWeightsForSamplerResponseInternal(sampling_session_id=sampler_id)

            return lambda: map_future(
                client.save_weights_and_get_sampling_client(kind=req.kind).future(), register
            )

        return await self._model_call(request, types.SaveWeightsForSamplerRequest, build)

    async def save_weights_external(self, request: Request) -> Response:
        """Export the weights as a Hugging Face folder (``tinker://<run>/external_weights/<name>``),
        downloadable through ``external_weights_urls``."""

        def build(req: types.SaveWeightsExternalRequest, model: TrainingModel) -> PendingCall:
            def saved(done: types.SaveWeightsExternalResponse) -> types.SaveWeightsExternalResponseInternal:
                folder, _ = self.service.store.resolve(done.path)
                size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
                return types.SaveWeightsExternalResponseInternal(path=done.path, size_bytes=size)

            return lambda: map_future(
                model.client.save_weights_external(
                    req.path,
                    ttl_seconds=req.ttl_seconds,
                    age_encryption_recipients=req.age_encryption_recipients,
                ).future(),
                saved,
            )

        return await self._model_call(request, types.SaveWeightsExternalRequest, build)

    async def load_weights(self, request: Request) -> Response:
        """Weights into an existing model (a sequenced call), or, with ``session_id``, a new model
        created from a checkpoint (the model's first request: no ``create_model``)."""

        def build(req: types.LoadWeightsRequest, model: TrainingModel) -> PendingCall:
            load = model.client.load_state_with_optimizer if req.optimizer else model.client.load_state
            return lambda: load(req.path).future()

        payload = await self._body(request, types.LoadWeightsRequest)
        if not isinstance(payload, dict) or payload.get("session_id") is None:
            return await self._model_call(request, types.LoadWeightsRequest, build)
        req = decode_json_model(types.LoadWeightsRequest, payload)
        self.state.session(req.session_id)
        base_model = self.resolve_model(req.base_model) if req.base_model is not None else None
        user_metadata = {str(k): str(v) for k, v in (req.user_metadata or {}).items()}
        if req.model_seq_id is None:
            raise ApiError(400, "load_weights with session_id needs model_seq_id")
        model_id = f"{req.session_id}:train:{req.model_seq_id}"

        def create() -> types.LoadWeightsResponse:
            if req.optimizer:
                made = self.service.create_training_client_from_state_with_optimizer(
                    req.path, base_model, user_metadata, run_id=model_id
                )
            else:
                made = self.service.create_training_client_from_state(
                    req.path, base_model, user_metadata, optimizer=req.optimizer_config, run_id=model_id
                )
            self._register(model_id, req.session_id, made.result())
            return types.LoadWeightsResponse(path=req.path, model_id=model_id)

        return self._future_response(request, self.executor.submit(create), model_id=model_id)
