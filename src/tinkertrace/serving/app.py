"""The OpenAI-compatible sampling endpoint as a Starlette ASGI app.

Routes: ``POST /v1/chat/completions``, ``POST /v1/responses``, ``POST /v1/completions``,
``POST /v1/messages`` (Anthropic's Messages API),
``GET /v1/models[/{id}]``, ``GET /health``, ``POST /v1/rollouts/{id}/reward|finish`` (with a
:class:`~tinkertrace.serving.recording.CallRecorder`, which records every call answered as a span),
and the admin routes ``GET|POST /admin/policy``
(enabled by an admin token) that show or swap the served weights from another process, and
``POST /admin/admission`` through which the trainer states its demand and consumption
(:mod:`tinkertrace.serving.admission`). Every answer names the policy version that produced it
(``policy_version`` field and ``x-tinkertrace-policy-version`` header).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tinkertrace import semconv
from tinkertrace.serving.admission import DEFAULT_LEASE_S, Demand
from tinkertrace.serving.anthropic_route import count_tokens, serve_messages
from tinkertrace.serving.batching import SampleBatcher
from tinkertrace.serving.checkpoint_watch import CheckpointWatcher
from tinkertrace.serving.context_window import PromptTooLong, context_limit
from tinkertrace.serving.conversations import ConversationStore, assistant_message
from tinkertrace.serving.generation import Generator
from tinkertrace.serving.guard import Handler, check_token, guarded, http_error
from tinkertrace.serving.limits import BodyLimit, RequestLimits
from tinkertrace.serving.openai_wire import completions as wire
from tinkertrace.serving.openai_wire.completions import Choice
from tinkertrace.serving.openai_wire.errors import (
    ApiError,
    context_length_exceeded,
    read_json,
    require_object,
)
from tinkertrace.serving.openai_wire.requests import ChatRequest, parse_chat_request, parse_completion_request
from tinkertrace.serving.openai_wire.responses import new_item_id, parse_responses_request, response_body
from tinkertrace.serving.openai_wire.responses_stream import stream_events
from tinkertrace.serving.openai_wire.responses_tools import note_left_out
from tinkertrace.serving.openai_wire.sse import sse_response
from tinkertrace.serving.policy import Policy, PolicyHolder, StalePolicyError
from tinkertrace.serving.probes import probe_routes
from tinkertrace.serving.recording import CallRecorder
from tinkertrace.serving.reward_routes import rollout_routes
from tinkertrace.serving.rollout_routing import RolloutPrefix, header_text
from tinkertrace.serving.tool_parsers import make_tool_parser
from tinkertrace.serving.tool_use import plan_tools


class SamplingEndpoint:
    """Request handlers bound to one :class:`PolicyHolder` (see :func:`create_app`)."""

    def __init__(
        self,
        policy: PolicyHolder,
        *,
        api_key: str | None,
        admin_token: str | None,
        default_max_tokens: int,
        batcher: SampleBatcher,
        tool_parser: str = "auto",
        recorder: CallRecorder | None = None,
    ) -> None:
        self.policy = policy
        self.tool_parser = make_tool_parser(tool_parser, getattr(policy.tokenizer, "chat_template", None))
        self.api_key = api_key
        self.admin_token = admin_token
        self.generator = Generator(policy.tokenizer, default_max_tokens=default_max_tokens, batcher=batcher)
        self.created = int(time.time())
        self.requests_served = 0
        self.watcher: CheckpointWatcher | None = None
        self.conversations = ConversationStore()
        self.recorder = recorder
        self.limits = RequestLimits()

    # --- plumbing ----------------------------------------------------------------------------------
    def _authenticate(self, request: Request, admin: bool) -> None:
        if admin:
            if self.admin_token is None:
                raise ApiError(
                    403,
                    "The admin API is disabled: start the server with an admin token.",
                    type="permission_error",
                    code="admin_disabled",
                )
            check_token(request, self.admin_token, "admin token")
        elif self.api_key is not None:
            check_token(request, self.api_key, "API key")

    def guarded(self, handler: Handler, *, admin: bool = False, recorded: bool = False) -> Handler:
        """Wrap a handler: authenticate, answer every failure in OpenAI's error format, and (``recorded``,
        with a recorder) record the call and its answer as an LLM span."""
        recorder = self.recorder if recorded else None
        return guarded(handler, lambda request: self._authenticate(request, admin), recorder)

    def _check_model(self, model: str) -> None:
        names = self.policy.served_names
        if model not in names:
            raise ApiError(
                404,
                f"The model `{model}` does not exist or you do not have access to it. "
                f"This server serves {', '.join(f'`{n}`' for n in names)}.",
                param="model",
                code="model_not_found",
            )

    async def _admit(self, request: Request) -> None:
        """Hold the first call of a new rollout until the trainer's demand has room for it (and for
        the rest of its task's group)."""
        rollout_id = header_text(request.headers, semconv.HEADER_ROLLOUT_ID)
        task_id = header_text(request.headers, semconv.HEADER_TASK_ID)
        await self.policy.admission.admit(rollout_id, task_id or None)

    # --- OpenAI routes -------------------------------------------------------------------------------
    def _version_fields(self, choices: list[Choice], policy: Policy) -> dict[str, Any]:
        """What every chat/completions object names: the policy version of its first choice's first
        token and that choice's per-token versions (``policy_version_runs``); each choice names its own."""
        fields = choices[0].version_fields(policy.version)
        return {"system_fingerprint": f"policy-v{policy.version}", **fields}

    async def _sample_chat(self, request: Request, req: ChatRequest) -> tuple[list[Choice], Policy]:
        """Admit, then sample a chat request with the policy current now (kept to the end)."""
        self._check_model(req.model)
        await self._admit(request)
        policy = self.policy.current()  # this request samples with this snapshot to the end
        plan = plan_tools(self.tool_parser, req.tools, req.tool_choice)
        prompt_ids = self.generator.chat_prompt(req.messages, req.tools, plan.prefix)
        sampled = await self.generator.generate(policy, prompt_ids, plan.options(req.options))
        self.requests_served += 1
        return [plan.apply(c) for c in sampled], policy

    async def chat(self, request: Request) -> Response:
        req = parse_chat_request(await read_json(request))
        try:
            choices, policy = await self._sample_chat(request, req)
        except PromptTooLong as exc:
            raise context_length_exceeded(exc.prompt_tokens, exc.limit) from None
        rid, headers = wire.new_id("chatcmpl"), {semconv.HEADER_POLICY_VERSION: str(policy.version)}
        extra = self._version_fields(choices, policy)
        if req.options.stream:
            chunks = wire.chat_chunks(
                rid, req.model, choices, include_usage=req.options.include_usage, extra=extra
            )
            return sse_response(chunks, headers)
        return JSONResponse(wire.chat_response(rid, req.model, choices, extra=extra), headers=headers)

    async def messages(self, request: Request) -> Response:
        """Anthropic's Messages API over the chat path (:mod:`tinkertrace.serving.anthropic_route`)."""
        return await serve_messages(self, request)

    async def responses(self, request: Request) -> Response:
        req = parse_responses_request(await read_json(request))
        self._check_model(req.model)
        history = self.conversations.history(req.previous_response_id)
        system = [{"role": "system", "content": req.instructions}] if req.instructions else []
        await self._admit(request)
        policy = self.policy.current()
        plan = plan_tools(self.tool_parser, req.tools, req.tool_choice)
        prompt_ids = self.generator.chat_prompt([*system, *history, *req.messages], req.tools, plan.prefix)
        try:
            [sampled] = await self.generator.generate(policy, prompt_ids, plan.options(req.options))
        except PromptTooLong as exc:
            raise context_length_exceeded(exc.prompt_tokens, exc.limit, responses=True) from None
        choice = plan.apply(sampled)
        note_left_out(request, req.left_out)
        self.requests_served += 1
        rid = new_item_id("resp")
        if req.store:
            self.conversations.put(rid, [*history, *req.messages, assistant_message(choice)])
        body = response_body(rid, req, choice, extra=choice.version_fields(policy.version))
        headers = {semconv.HEADER_POLICY_VERSION: str(policy.version)}
        if req.options.stream:
            return sse_response(stream_events(body), headers, named=True)
        return JSONResponse(body, headers=headers)

    async def completions(self, request: Request) -> Response:
        req = parse_completion_request(await read_json(request))
        self._check_model(req.model)
        await self._admit(request)
        policy = self.policy.current()
        prompts = [self.generator.text_prompt(p, i) for i, p in enumerate(req.prompts)]
        try:
            per_prompt = await asyncio.gather(
                *(self.generator.generate(policy, ids, req.options) for ids in prompts)
            )
        except PromptTooLong as exc:
            raise context_length_exceeded(exc.prompt_tokens, exc.limit) from None
        choices = [c for group in per_prompt for c in group]
        self.requests_served += 1
        rid, headers = wire.new_id("cmpl"), {semconv.HEADER_POLICY_VERSION: str(policy.version)}
        o, extra = req.options, self._version_fields(choices, policy)
        if o.stream:
            chunks = wire.completion_chunks(
                rid, req.model, choices, o.n, o.top_logprobs, include_usage=o.include_usage, extra=extra
            )
            return sse_response(chunks, headers)
        body = wire.completion_response(rid, req.model, choices, o.n, o.top_logprobs, extra=extra)
        if len(req.prompts) == 1:  # one prompt: its ids also at the top level, like chat
            body[semconv.RESPONSE_PROMPT_TOKEN_IDS] = choices[0].prompt_token_ids
        return JSONResponse(body, headers=headers)

    def _models(self) -> dict[str, Any]:
        extra = {semconv.RESPONSE_POLICY_VERSION: self.policy.version}
        window = context_limit(self.policy.current().sampling_client)
        return wire.models_list(self.policy.served_names, self.created, extra, context_length=window)

    async def models(self, request: Request) -> Response:
        return JSONResponse(self._models())

    async def model(self, request: Request) -> Response:
        name = request.path_params["model"]
        self._check_model(name)
        return JSONResponse(next(m for m in self._models()["data"] if m["id"] == name))

    # --- health and admin ----------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        body: dict[str, Any] = {
            "status": "ok",
            semconv.RESPONSE_POLICY_VERSION: self.policy.version,
            "admission": self.policy.admission.stats(),
            "requests_refused": self.limits.refused,
        }
        if self.recorder is not None:
            body["recording"] = self.recorder.stats()
        return JSONResponse(body)

    def _policy_info(self) -> dict[str, Any]:
        current = self.policy.current()
        info: dict[str, Any] = {
            "model": self.policy.model_name,
            semconv.RESPONSE_POLICY_VERSION: current.version,
            "model_path": current.model_path,
            "loaded_at": current.loaded_at,
            "swaps": self.policy.swaps,
            "sampler_kind": self.policy.sampler_kind,  # the form POST /admin/policy wants new weights in
            "requests_served": self.requests_served,
            "sample_calls": self.generator.batcher.calls,
            "admission": self.policy.admission.stats(),
        }
        if self.watcher is not None:
            info["watch"] = self.watcher.describe()
        return info

    async def get_policy(self, request: Request) -> Response:
        return JSONResponse(self._policy_info())

    async def set_policy(self, request: Request) -> Response:
        body = require_object(await read_json(request))
        model_path = body.get("model_path")
        if not isinstance(model_path, str) or not model_path:
            raise ApiError(
                400,
                "Missing required parameter: 'model_path' (a sampler checkpoint path).",
                param="model_path",
            )
        version = body.get("version")
        if version is not None and type(version) is not int:
            raise ApiError(400, "Invalid type for 'version': expected an integer.", param="version")
        handle = body.get("sampler_handle")
        if handle is not None and (not isinstance(handle, str) or not handle):
            raise ApiError(
                400, "Invalid type for 'sampler_handle': expected a string.", param="sampler_handle"
            )
        try:
            await asyncio.to_thread(self.policy.load, model_path, version, handle)
        except StalePolicyError as exc:
            raise ApiError(409, str(exc), param="version", code="stale_version") from exc
        except Exception as exc:
            raise ApiError(
                400, f"Could not load '{model_path}': {exc}", param="model_path", code="load_failed"
            ) from exc
        return JSONResponse(
            self._policy_info(), headers={semconv.HEADER_POLICY_VERSION: str(self.policy.version)}
        )

    async def set_admission(self, request: Request) -> Response:
        """The trainer's demand (``rollouts_per_step``, ``max_staleness``, optional ``group_size`` and
        ``lease_s``; re-stated to renew it; ``withdraw: true`` when it stops) and/or the
        ``rollout_ids`` it trained or dropped: see :mod:`.admission`."""
        body = require_object(await read_json(request))
        gate = self.policy.admission
        if body.get("withdraw") is True:
            gate.withdraw()
        if "rollouts_per_step" in body or "max_staleness" in body:
            per_step, staleness = body.get("rollouts_per_step"), body.get("max_staleness")
            if type(per_step) is not int or type(staleness) is not int or per_step < 1 or staleness < 0:
                raise ApiError(
                    400,
                    "'rollouts_per_step' (an integer >= 1) and 'max_staleness' (an integer >= 0) "
                    "go together.",
                    param="rollouts_per_step",
                )
            group_size = body.get("group_size", 1)
            if type(group_size) is not int or group_size < 1:
                raise ApiError(400, "'group_size' must be an integer >= 1.", param="group_size")
            lease_s = body.get("lease_s", DEFAULT_LEASE_S)
            if type(lease_s) not in (int, float):
                raise ApiError(400, "'lease_s' must be a number of seconds.", param="lease_s")
            try:  # the other fields are checked above: what Demand refuses now is the lease
                demand = Demand(per_step, staleness, group_size, float(lease_s))
            except ValueError as exc:
                raise ApiError(400, str(exc), param="lease_s") from exc
            gate.set_demand(demand)
        if "rollout_ids" in body:
            ids = body["rollout_ids"]
            if not isinstance(ids, list) or not all(isinstance(r, str) for r in ids):
                raise ApiError(400, "'rollout_ids' must be a list of strings.", param="rollout_ids")
            gate.consume(ids)
        return JSONResponse(gate.stats())


def create_app(
    policy: PolicyHolder,
    api_key: str | None = None,
    admin_token: str | None = None,
    *,
    default_max_tokens: int = 256,
    batch_window_s: float = 0.005,
    watch_checkpoints: Path | str | None = None,
    watch_poll_s: float = 0.5,
    tool_parser: str = "auto",
    recorder: CallRecorder | None = None,
    limits: RequestLimits | None = None,
) -> Starlette:
    """The OpenAI-compatible ASGI app serving ``policy``.

    ``api_key``: when set, ``/v1/*`` requires ``Authorization: Bearer <api_key>``.
    ``admin_token``: when set, enables ``/admin/policy`` (Bearer ``admin_token``) to swap weights.
    ``default_max_tokens``: used when a request sets no ``max_tokens``.
    ``batch_window_s``: how long identical requests wait to share one sample call (0: never).
    ``watch_checkpoints``: a checkpoint record (JSON lines) to follow; each new record is served.
    ``tool_parser``: how tool calls are read from replies (see :mod:`tinkertrace.serving.tool_parsers`).
    ``recorder``: records every call answered, and the rollout routes' rewards and ends, as spans
    (:mod:`tinkertrace.serving.recording`); flushed and closed when the app shuts down.
    ``limits``: the request body size and time limits on every route (default 4 MiB, 60 s).
    """
    limits = limits or RequestLimits()
    endpoint = SamplingEndpoint(
        policy,
        api_key=api_key,
        admin_token=admin_token,
        default_max_tokens=default_max_tokens,
        batcher=SampleBatcher(window_s=batch_window_s),
        tool_parser=tool_parser,
        recorder=recorder,
    )
    if watch_checkpoints is not None:
        endpoint.watcher = CheckpointWatcher(Path(watch_checkpoints), policy, poll_s=watch_poll_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(endpoint.watcher.run()) if endpoint.watcher else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if recorder is not None:
                await asyncio.to_thread(recorder.close)

    g = endpoint.guarded
    routes = [
        Route("/v1/chat/completions", g(endpoint.chat, recorded=True), methods=["POST"]),
        Route("/v1/responses", g(endpoint.responses, recorded=True), methods=["POST"]),
        Route("/v1/completions", g(endpoint.completions, recorded=True), methods=["POST"]),
        Route("/v1/messages", g(endpoint.messages, recorded=True), methods=["POST"]),
        Route("/v1/messages/count_tokens", g(partial(count_tokens, endpoint)), methods=["POST"]),
        *rollout_routes(recorder, g),
        Route("/v1/models", g(endpoint.models), methods=["GET"]),
        Route("/v1/models/{model:path}", g(endpoint.model), methods=["GET"]),
        Route("/health", endpoint.health, methods=["GET"]),
        Route("/admin/policy", g(endpoint.get_policy, admin=True), methods=["GET"]),
        Route("/admin/policy", g(endpoint.set_policy, admin=True), methods=["POST"]),
        Route("/admin/admission", g(endpoint.set_admission, admin=True), methods=["POST"]),
        *probe_routes(),  # HEAD/GET on the base URL and /api/hello, as harnesses probe
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={HTTPException: http_error},
        middleware=[Middleware(BodyLimit, limits=limits), Middleware(RolloutPrefix)],
    )
    app.state.endpoint = endpoint
    endpoint.limits = limits
    return app
