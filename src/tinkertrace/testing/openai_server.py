"""A deterministic OpenAI-compatible server for tests and benchmarks (no model, no torch).

The stand-in for vLLM in the SDK's tests: it validates requests and builds every answer with the
same OpenAI wire module as the sampling endpoint (:mod:`tinkertrace.serving.openai_wire`), sends
vLLM's token-id extension only when a request asks with ``return_token_ids``, and streams text in
small pieces (``chunk_chars`` characters, or one token each with a tokenizer) as vLLM streams
tokens. Its model is bytes (:mod:`.replies`): token ids are UTF-8 bytes, logprobs a fixed function
of each byte, replies from a pluggable responder.

It answers ``/v1/chat/completions`` and ``/v1/completions`` (streaming as SSE or not, with
``return_token_ids`` and ``logprobs``), ``/v1/responses`` (the Responses API, streaming or not, with
the token-id extension of :mod:`tinkertrace.semconv`) and ``/v1/models``::

    server = OpenAITestServer()
    with BackgroundServer(server.app) as bg:
        client = openai.OpenAI(base_url=bg.url + "/v1", api_key="x")
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tinkertrace import semconv
from tinkertrace.serving import tool_parsers
from tinkertrace.serving.openai_wire import completions as wire
from tinkertrace.serving.openai_wire.completions import Choice
from tinkertrace.serving.openai_wire.errors import ApiError, read_json, require_object
from tinkertrace.serving.openai_wire.requests import parse_chat_request, parse_completion_request
from tinkertrace.serving.openai_wire.responses import parse_responses_request, response_body
from tinkertrace.serving.openai_wire.responses_stream import Logprobs, stream_events
from tinkertrace.serving.openai_wire.sse import sse_response
from tinkertrace.testing.replies import (
    ReplyRequest,
    Responder,
    ToolCall,
    byte_logprob,
    echo_responder,
    render_chat,
    scripted_responder,
    token_text,
    top_alternatives,
)

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_MODEL",
    "OpenAITestServer",
    "ReplyRequest",
    "Responder",
    "RunningServer",
    "ServerOptions",
    "ToolCall",
    "byte_logprob",
    "echo_responder",
    "render_chat",
    "scripted_responder",
    "start_server",
    "token_text",
]

DEFAULT_MODEL = "test-model"
DEFAULT_MAX_TOKENS = 256


@dataclass
class ServerOptions:
    """Behaviour switches; mutable between requests (tests flip them on a running server)."""

    responder: Responder = echo_responder
    model: str = DEFAULT_MODEL
    token_ids: bool = True  # honour return_token_ids; False imitates a server without the extension
    logprobs: bool = True  # honour logprobs requests
    policy_version: int | None = None  # sent as a response field and header when set
    latency_s: float = 0.0  # delay before answering (and between stream chunks: latency_s / 10)
    fail_status: int | None = None  # answer this HTTP status ...
    fail_times: int = 0  # ... for this many requests (then succeed again); -1: always
    chunk_chars: int = 1  # characters per streamed chunk
    reject_fields: tuple[str, ...] = ()  # answer 400 to requests with these fields (a strict server)
    max_context_tokens: int | None = None  # answer vLLM's context-length 400 to longer prompts
    # A transformers tokenizer for the chat and completions endpoints: prompt ids from its chat template
    # (with the request's tools), reply ids from its vocabulary, streamed a token a chunk. None: byte
    # tokens (always on /v1/responses).
    tokenizer: Any = None


def _refusal(status: int, message: str) -> ApiError:
    """An error as vLLM answers it (the HTTP status as ``code``)."""
    kind = "invalid_request_error" if status == 400 else "server_error"
    return ApiError(status, message, type=kind, code=status)


@dataclass
class OpenAITestServer:
    """The ASGI app plus its options and a log of the request bodies it received."""

    options: ServerOptions = field(default_factory=ServerOptions)
    requests: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._counter = itertools.count(1)
        guard = self._guarded
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", guard(self._chat), methods=["POST"]),
                Route("/v1/completions", guard(self._completions), methods=["POST"]),
                Route("/v1/responses", guard(self._responses), methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )

    # --- requests --------------------------------------------------------------------------------
    def _guarded(
        self, handler: Callable[[dict[str, Any]], Response]
    ) -> Callable[[Request], Awaitable[Response]]:
        """Read and log the body, apply the injected behaviour, answer :class:`ApiError` as a refusal."""

        async def run(request: Request) -> Response:
            try:
                return handler(await self._read(request))
            except ApiError as err:
                return err.response()

        return run

    async def _read(self, request: Request) -> dict[str, Any]:
        body = require_object(await read_json(request))
        with self._lock:
            self.requests.append(body)
            failing = self.options.fail_status is not None and self.options.fail_times != 0
            if failing and self.options.fail_times > 0:
                self.options.fail_times -= 1
        if self.options.latency_s:
            await asyncio.sleep(self.options.latency_s)
        if failing:
            raise _refusal(int(self.options.fail_status or 500), "injected failure")
        unknown = sorted(set(self.options.reject_fields) & set(body))
        if unknown:
            raise _refusal(400, f"Unrecognized request argument supplied: {', '.join(unknown)}")
        return body

    def _next_id(self, prefix: str) -> str:
        """Response ids numbered in arrival order: ``chatcmpl-00000001``, ``resp-00000002``, ..."""
        with self._lock:
            return f"{prefix}-{next(self._counter):08d}"

    def _check_context(self, prompt_tokens: int) -> None:
        """vLLM's 400 for a prompt longer than ``max_context_tokens``."""
        limit = self.options.max_context_tokens
        if limit is not None and prompt_tokens > limit:
            raise _refusal(
                400,
                f"This model's maximum context length is {limit} tokens. However, your request has "
                f"{prompt_tokens} input tokens. Please reduce the length of the input messages.",
            )

    def _wants_ids(self, body: dict[str, Any]) -> bool:
        return bool(body.get(semconv.REQUEST_RETURN_TOKEN_IDS)) and self.options.token_ids

    def _extra(self) -> dict[str, Any]:
        version = self.options.policy_version
        return {} if version is None else {semconv.RESPONSE_POLICY_VERSION: version}

    def _headers(self) -> dict[str, str]:
        version = self.options.policy_version
        return {} if version is None else {semconv.HEADER_POLICY_VERSION: str(version)}

    # --- the byte (or tokenizer) model -------------------------------------------------------------
    def _encode(self, text: str, *, bytes_only: bool = False) -> list[int]:
        tok = None if bytes_only else self.options.tokenizer
        return list(text.encode()) if tok is None else list(tok.encode(text, add_special_tokens=False))

    def _decode(self, ids: list[int], *, bytes_only: bool = False) -> str:
        tok = None if bytes_only else self.options.tokenizer
        return bytes(ids).decode(errors="ignore") if tok is None else str(tok.decode(ids))

    def _sample(
        self,
        reply: str,
        prompt_ids: list[int],
        max_tokens: int | None,
        top_n: int | None,
        *,
        bytes_only: bool = False,
    ) -> Choice:
        """``reply`` as a sampled choice, cut at ``max_tokens``; logprobs (``top_n`` alternatives)
        unless ``top_n`` is None."""
        ids = self._encode(reply, bytes_only=bytes_only)
        finish = "stop"
        if len(ids) > (max_tokens or DEFAULT_MAX_TOKENS):
            ids = ids[: max_tokens or DEFAULT_MAX_TOKENS]
            reply, finish = self._decode(ids, bytes_only=bytes_only), "length"
        with_logprobs = top_n is not None and self.options.logprobs
        return Choice(
            text=reply,
            token_ids=ids,
            logprobs=[byte_logprob(t) for t in ids] if with_logprobs else None,
            token_texts=[token_text(t) for t in ids] if with_logprobs else None,
            top_logprobs=[top_alternatives(t, top_n or 0) for t in ids] if with_logprobs else None,
            finish_reason=finish,
            prompt_token_ids=prompt_ids,
        )

    def _replies(self, req: ReplyRequest, n: int) -> list[str]:
        """``n`` replies of the responder; a :class:`ToolCall` as the text a model writes for it."""
        out = []
        for i in range(n):
            reply = self.options.responder(dataclasses.replace(req, choice_index=req.choice_index + i))
            out.append(reply.text() if isinstance(reply, ToolCall) else reply)
        return out

    def _split(self, choice: Choice) -> list[Choice]:
        """Stream pieces: ``chunk_chars`` characters (their bytes) each, or one token each."""
        if self.options.tokenizer is not None:
            return [choice.piece(k, k + 1, self._decode([t])) for k, t in enumerate(choice.token_ids)]
        step, pieces, at = max(1, self.options.chunk_chars), [], 0
        for i in range(0, len(choice.text), step):
            text = choice.text[i : i + step]
            size = len(text.encode())
            pieces.append(choice.piece(at, at + size, text))
            at += size
        return pieces

    def _split_text(self, text: str, logprobs: Logprobs) -> list[tuple[str, Logprobs]]:
        """Responses deltas: ``chunk_chars`` characters each, with the logprobs of their bytes."""
        step, pieces, at = max(1, self.options.chunk_chars), [], 0
        for i in range(0, len(text), step):
            size = len(text[i : i + step].encode())
            pieces.append((text[i : i + step], logprobs[at : at + size]))
            at += size
        return pieces

    # --- endpoints -------------------------------------------------------------------------------
    async def _models(self, request: Request) -> Response:
        return JSONResponse(wire.models_list(self.options.model, 0))

    def _chat(self, body: dict[str, Any]) -> Response:
        req = parse_chat_request(body)
        tok = self.options.tokenizer
        if tok is None:
            prompt_ids = list(render_chat(req.messages).encode())
        else:
            template = tok.apply_chat_template(
                req.messages, tools=body.get("tools"), add_generation_prompt=True, tokenize=False
            )
            prompt_ids = self._encode(template)
        self._check_context(len(prompt_ids))
        o = req.options
        top_n = o.top_logprobs if o.logprobs else None
        replies = self._replies(ReplyRequest("chat", req.model, body, req.messages, None, 0), o.n)
        choices = [self._sample(reply, prompt_ids, o.max_tokens, top_n) for reply in replies]
        rid, ids, extra = self._next_id("chatcmpl"), self._wants_ids(body), self._extra()
        if not o.stream:
            return JSONResponse(
                wire.chat_response(rid, req.model, choices, token_ids=ids, extra=extra),
                headers=self._headers(),
            )
        chunks = wire.chat_chunks(
            rid,
            req.model,
            choices,
            include_usage=o.include_usage,
            token_ids=ids,
            extra=extra,
            split=self._split,
        )
        return sse_response(chunks, self._headers(), delay_s=self.options.latency_s / 10)

    def _prompt(self, prompt: str | list[int]) -> tuple[str, list[int]]:
        """A completion prompt as ``(text, token ids)``."""
        if isinstance(prompt, str):
            return prompt, self._encode(prompt)
        if self.options.tokenizer is None and any(t > 255 for t in prompt):
            raise _refusal(400, "'prompt' token ids must be bytes (0..255): this server's tokens are bytes")
        return self._decode(prompt), list(prompt)

    def _completions(self, body: dict[str, Any]) -> Response:
        req = parse_completion_request(body)
        o = req.options
        top_n = o.top_logprobs if o.logprobs else None
        choices: list[Choice] = []
        for text, prompt_ids in map(self._prompt, req.prompts):
            self._check_context(len(prompt_ids))
            ask = ReplyRequest("completion", req.model, body, None, text, len(choices))
            choices += [
                self._sample(reply, prompt_ids, o.max_tokens, top_n) for reply in self._replies(ask, o.n)
            ]
        rid, ids, extra = self._next_id("cmpl"), self._wants_ids(body), self._extra()
        if not o.stream:
            body = wire.completion_response(
                rid, req.model, choices, o.n, o.top_logprobs, token_ids=ids, extra=extra
            )
            return JSONResponse(body, headers=self._headers())
        chunks = wire.completion_chunks(
            rid,
            req.model,
            choices,
            o.n,
            o.top_logprobs,
            include_usage=o.include_usage,
            token_ids=ids,
            extra=extra,
            split=self._split,
        )
        return sse_response(chunks, self._headers(), delay_s=self.options.latency_s / 10)

    def _responses(self, body: dict[str, Any]) -> Response:
        req = parse_responses_request(body)
        if not self.options.logprobs:
            req = dataclasses.replace(req, options=dataclasses.replace(req.options, logprobs=False))
        system = [{"role": "system", "content": req.instructions}] if req.instructions else []
        messages = [*system, *req.messages]
        prompt_ids = list(render_chat(messages).encode())
        self._check_context(len(prompt_ids))
        reply = self.options.responder(ReplyRequest("responses", req.model, body, messages, None, 0))
        text = reply.text() if isinstance(reply, ToolCall) else reply
        top_n = 0 if req.options.logprobs else None
        choice = self._sample(text, prompt_ids, req.options.max_tokens, top_n, bytes_only=True)
        if isinstance(reply, ToolCall) and choice.finish_reason == "stop":  # a whole call: an item
            call = tool_parsers.ToolCall(reply.call_id, reply.name, reply.arguments)
            choice = dataclasses.replace(choice, text="", finish_reason="tool_calls", tool_calls=(call,))
        response = response_body(
            self._next_id("resp"), req, choice, token_ids=self._wants_ids(body), extra=self._extra()
        )
        if not req.options.stream:
            return JSONResponse(response, headers=self._headers())
        events = stream_events(response, split=self._split_text)
        return sse_response(events, self._headers(), named=True, delay_s=self.options.latency_s / 10)


@dataclass
class RunningServer:
    """A test server running on a loopback port (see :func:`start_server`)."""

    server: OpenAITestServer
    background: Any

    @property
    def url(self) -> str:
        return str(self.background.url)

    @property
    def base_url(self) -> str:
        """The OpenAI client's ``base_url``: ``http://127.0.0.1:<port>/v1``."""
        return self.url + "/v1"

    @property
    def options(self) -> ServerOptions:
        return self.server.options

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self.server.requests

    def stop(self) -> None:
        self.background.stop()


def start_server(options: ServerOptions | None = None) -> RunningServer:
    """Start a test server on a free loopback port in a background thread; ``.stop()`` ends it."""
    from tinkertrace.netutil import BackgroundServer

    server = OpenAITestServer(options or ServerOptions())
    return RunningServer(server, BackgroundServer(server.app).start())


def main() -> None:
    """``python -m tinkertrace.testing.openai_server --port N``: serve until interrupted."""
    import argparse

    import uvicorn

    parser = argparse.ArgumentParser(description="Deterministic OpenAI-compatible test server.")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument("--reply", default=None, help="fixed reply text (default: echo the prompt)")
    parser.add_argument("--chunk-chars", type=int, default=1, help="characters per streamed chunk")
    args = parser.parse_args()
    options = ServerOptions(chunk_chars=args.chunk_chars)
    if args.reply is not None:
        options.responder = scripted_responder([args.reply])
    uvicorn.run(OpenAITestServer(options).app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
