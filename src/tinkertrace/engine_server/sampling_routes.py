"""Sampling routes of ``tinkertrace engine``: sampling sessions and ``asample``."""

from __future__ import annotations

import asyncio
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from tinker import types

from tinkertrace.engine_server.core import EngineCore, dump
from tinkertrace.engine_server.http import USER_ERRORS, ApiError
from tinkertrace.engine_server.state import Sampler
from tinkertrace.engine_server.wire import tensor_from_model
from tinkertrace.futures import failed


class SamplingRoutes(EngineCore):
    def _model_name_of(self, model_path: str) -> str | None:
        """The model name a checkpoint's run was asked for (an alias, when one was used)."""
        _, meta = self.service.store.resolve(model_path)
        return meta.get("model_name")

    async def create_sampling_session(self, request: Request) -> Response:
        req = await self._json(request, types.CreateSamplingSessionRequest)
        self.state.session(req.session_id)
        sampler_id = f"{req.session_id}:sample:{req.sampling_session_seq_id}"
        base_model = self.resolve_model(req.base_model) if req.base_model is not None else None
        made = await asyncio.wrap_future(
            self.executor.submit(
                lambda: self.service.create_sampling_client(
                    model_path=req.model_path, base_model=base_model
                ).result()
            )
        )
        name = req.base_model if req.model_path is None else self._model_name_of(req.model_path)
        self.state.add_sampler(Sampler(sampler_id, name or made.get_base_model(), req.model_path, made))
        return JSONResponse(dump(types.CreateSamplingSessionResponse(sampling_session_id=sampler_id)))

    async def join_sampling_session(self, request: Request) -> Response:
        req = await self._json(request, types.JoinSamplingSessionRequest)
        sampler = self.state.sampler(req.sampling_session_id)
        sampler.clones += 1
        return JSONResponse(dump(types.JoinSamplingSessionResponse(client_counter=sampler.clones)))

    async def get_sampler(self, request: Request) -> Response:
        sampler = self.state.sampler(request.path_params["sampler_id"])
        answer = types.GetSamplerResponse(
            sampler_id=sampler.sampler_id, base_model=sampler.base_model, model_path=sampler.model_path
        )
        return JSONResponse(dump(answer))

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
                target_prompt_logprobs=tensor_from_model(req.target_prompt_logprobs),
                prompt_alt_tokens_k=req.prompt_alt_tokens_k,
                prompt_logprobs_last_n=req.prompt_logprobs_last_n,
            ).future()
        except USER_ERRORS as exc:  # refused up front (an image chunk, a bad target tensor, ...)
            future = failed(exc)
        sequence_ids = [uuid.uuid4().hex for _ in range(req.num_samples)]
        return self._future_response(request, future, encoding="proto", sample_sequence_ids=sequence_ids)
