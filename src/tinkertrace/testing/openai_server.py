"""A deterministic OpenAI-compatible server for tests and benchmarks (no model, no torch).

Tokens are bytes: the prompt's token ids are the UTF-8 bytes of a simple rendering of the chat
(:func:`render_chat`), the reply's token ids are the UTF-8 bytes of the reply text, and each token's
logprob is a fixed function of its byte (:func:`byte_logprob`), so tests can compute every expected
value. Replies come from a pluggable responder (default :func:`echo_responder`).

It answers ``/v1/chat/completions`` and ``/v1/completions`` (streaming as SSE or not, with vLLM-style
``return_token_ids`` and OpenAI-style ``logprobs``), ``/v1/responses`` (the Responses API, streaming
or not, with the token-id extension of :mod:`tinkertrace.semconv`; see :mod:`.responses_route`) and
``/v1/models``::

    server = OpenAITestServer()
    with BackgroundServer(server.app) as bg:
        client = openai.OpenAI(base_url=bg.url + "/v1", api_key="x")
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tinkertrace import semconv

DEFAULT_MODEL = "test-model"
DEFAULT_MAX_TOKENS = 256


@dataclass(frozen=True)
class ReplyRequest:
    """What a responder sees: the parsed request of one choice."""

    kind: str  # "chat" | "completion"
    model: str
    body: dict[str, Any]
    messages: list[dict[str, Any]] | None
    prompt: str | None
    choice_index: int


@dataclass(frozen=True)
class ToolCall:
    """A reply that calls a function (served as a ``function_call`` item on ``/v1/responses``; the chat
    endpoints send its :meth:`text`). Its sampled tokens are the bytes of :meth:`text`, as a model that
    writes ``<tool_call>`` blocks samples them."""

    name: str
    arguments: str  # JSON text
    call_id: str = "call_1"

    def text(self) -> str:
        return "<tool_call>" + json.dumps({"name": self.name, "arguments": self.arguments}) + "</tool_call>"


Responder = Callable[[ReplyRequest], "str | ToolCall"]


def _content_text(content: Any) -> str:
    """The text of a message's ``content`` (a string or a list of ``{"type": "text"}`` parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def echo_responder(req: ReplyRequest) -> str:
    """The default reply: ``"echo: "`` and the last user message (or the completion prompt)."""
    if req.messages is not None:
        users = [m for m in req.messages if m.get("role") == "user"]
        return "echo: " + (_content_text(users[-1].get("content")) if users else "")
    return "echo: " + (req.prompt or "")


def scripted_responder(replies: list[str]) -> Responder:
    """A responder that returns ``replies`` in order, cycling (thread-safe)."""
    cycle = itertools.cycle(replies)
    lock = threading.Lock()

    def respond(_: ReplyRequest) -> str:
        with lock:
            return next(cycle)

    return respond


def render_chat(messages: list[dict[str, Any]]) -> str:
    """The text the server 'tokenises' for a chat prompt: ``<|role|>\\ncontent\\n`` per message, then
    ``<|assistant|>\\n``."""
    parts = [f"<|{m.get('role', 'user')}|>\n{_content_text(m.get('content'))}\n" for m in messages]
    return "".join(parts) + "<|assistant|>\n"


def byte_logprob(token_id: int) -> float:
    """The deterministic logprob of a byte token (exactly representable in float32)."""
    return -((token_id % 16) + 1) / 16.0


def token_text(token_id: int) -> str:
    """The display string of a byte token (vLLM's ``bytes:`` form for non-ASCII bytes)."""
    return chr(token_id) if token_id < 128 else f"bytes:\\x{token_id:02x}"


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
    # (with the request's tools), reply ids from its vocabulary, streamed a token a chunk. None: the byte
    # tokens described above (always on /v1/responses).
    tokenizer: Any = None


@dataclass
class _Choice:
    index: int
    text: str
    ids: list[int]
    finish_reason: str


@dataclass
class OpenAITestServer:
    """The ASGI app plus its options and a log of the request bodies it received."""

    options: ServerOptions = field(default_factory=ServerOptions)
    requests: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/completions", self._completions, methods=["POST"]),
                Route("/v1/responses", self._responses, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )

    # --- helpers ---------------------------------------------------------------------------------
    def _next_id(self, prefix: str) -> str:
        with self._lock:
            return f"{prefix}-{next(self._counter):08d}"

    async def _read(self, request: Request) -> dict[str, Any] | Response:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error(400, f"request body is not valid JSON: {exc}")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object")
        with self._lock:
            self.requests.append(body)
            failing = self.options.fail_status is not None and self.options.fail_times != 0
            if failing and self.options.fail_times > 0:
                self.options.fail_times -= 1
        if self.options.latency_s:
            await asyncio.sleep(self.options.latency_s)
        if failing:
            return _error(int(self.options.fail_status or 500), "injected failure")
        unknown = sorted(set(self.options.reject_fields) & set(body))
        if unknown:
            return _error(400, f"Unrecognized request argument supplied: {', '.join(unknown)}")
        return body

    def _encode(self, text: str) -> list[int]:
        tok = self.options.tokenizer
        return list(text.encode()) if tok is None else list(tok.encode(text, add_special_tokens=False))

    def _decode(self, ids: list[int]) -> str:
        tok = self.options.tokenizer
        return bytes(ids).decode(errors="ignore") if tok is None else str(tok.decode(ids))

    def _chat_prompt_ids(self, messages: list[dict[str, Any]], body: dict[str, Any]) -> list[int]:
        tok = self.options.tokenizer
        if tok is None:
            return list(render_chat(messages).encode())
        text = tok.apply_chat_template(
            messages, tools=body.get("tools"), add_generation_prompt=True, tokenize=False
        )
        return self._encode(text)

    def _pieces(self, text: str) -> list[tuple[str, list[int]]]:
        if self.options.tokenizer is None:
            return _pieces(text, self.options.chunk_chars)
        return [(self._decode([t]), [t]) for t in self._encode(text)]

    def context_error(self, prompt_tokens: int) -> Response | None:
        """vLLM's 400 for a prompt longer than ``max_context_tokens``, else None."""
        limit = self.options.max_context_tokens
        if limit is None or prompt_tokens <= limit:
            return None
        return _error(
            400,
            f"This model's maximum context length is {limit} tokens. However, your request has "
            f"{prompt_tokens} input tokens. Please reduce the length of the input messages.",
        )

    def _headers(self) -> dict[str, str]:
        version = self.options.policy_version
        return {} if version is None else {semconv.HEADER_POLICY_VERSION: str(version)}

    def _choices(self, req: ReplyRequest, n: int, max_tokens: int) -> list[_Choice]:
        out = []
        for i in range(n):
            text = self.options.responder(
                ReplyRequest(req.kind, req.model, req.body, req.messages, req.prompt, i)
            )
            text = text.text() if isinstance(text, ToolCall) else text
            ids = self._encode(text)
            finish = "stop"
            if len(ids) > max_tokens:
                ids = ids[:max_tokens]
                text = self._decode(ids)
                finish = "length"
            out.append(_Choice(i, text, ids, finish))
        return out

    def _answer(
        self, req: ReplyRequest, n: int, max_tokens: int, prompt_tokens: int, id_prefix: str
    ) -> tuple[list[_Choice], str, dict[str, int], dict[str, Any]]:
        """``(choices, response id, usage, extra top-level fields)`` of one request."""
        choices = self._choices(req, n, max_tokens)
        usage = _usage(prompt_tokens, sum(len(c.ids) for c in choices))
        extra: dict[str, Any] = {}
        if self.options.policy_version is not None:
            extra[semconv.RESPONSE_POLICY_VERSION] = self.options.policy_version
        return choices, self._next_id(id_prefix), usage, extra

    def _common(self, body: dict[str, Any]) -> tuple[int, int, bool, bool, bool] | Response:
        """``(n, max_tokens, want_ids, stream, usage_in_stream)`` of a request, or a 400 answer."""
        try:
            n = int(body.get("n") or 1)
            max_tokens = int(
                body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_TOKENS
            )
        except (TypeError, ValueError):
            return _error(400, "n and max_tokens must be integers")
        if n < 1 or max_tokens < 1:
            return _error(400, "n and max_tokens must be at least 1")
        want_ids = bool(body.get(semconv.REQUEST_RETURN_TOKEN_IDS)) and self.options.token_ids
        stream = bool(body.get("stream"))
        usage_in_stream = bool((body.get("stream_options") or {}).get("include_usage"))
        return n, max_tokens, want_ids, stream, usage_in_stream

    # --- endpoints -------------------------------------------------------------------------------
    async def _models(self, request: Request) -> Response:
        model = {"id": self.options.model, "object": "model", "created": 0, "owned_by": "tinkertrace"}
        return JSONResponse({"object": "list", "data": [model]})

    async def _chat(self, request: Request) -> Response:
        body = await self._read(request)
        if isinstance(body, Response):
            return body
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            return _error(400, "'messages' must be a non-empty list of message objects")
        common = self._common(body)
        if isinstance(common, Response):
            return common
        n, max_tokens, want_ids, stream, usage_in_stream = common
        want_logprobs = bool(body.get("logprobs")) and self.options.logprobs
        top_n = int(body.get("top_logprobs") or 0)
        model = str(body.get("model") or self.options.model)
        prompt_ids = self._chat_prompt_ids(messages, body)
        if too_long := self.context_error(len(prompt_ids)):
            return too_long
        req = ReplyRequest("chat", model, body, messages, None, 0)
        choices, rid, usage, extra = self._answer(req, n, max_tokens, len(prompt_ids), "chatcmpl")
        if not stream:
            out_choices = []
            for c in choices:
                choice: dict[str, Any] = {
                    "index": c.index,
                    "message": {"role": "assistant", "content": c.text},
                    "finish_reason": c.finish_reason,
                    "logprobs": {"content": _chat_logprobs(c.ids, top_n)} if want_logprobs else None,
                }
                if want_ids:
                    choice[semconv.RESPONSE_CHOICE_TOKEN_IDS] = c.ids
                out_choices.append(choice)
            payload: dict[str, Any] = {
                "id": rid,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": out_choices,
                "usage": usage,
                **extra,
            }
            if want_ids:
                payload[semconv.RESPONSE_PROMPT_TOKEN_IDS] = prompt_ids
            return JSONResponse(payload, headers=self._headers())

        def chunks() -> list[dict[str, Any]]:
            created = int(time.time())
            base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, **extra}
            out: list[dict[str, Any]] = []
            for c in choices:
                first: dict[str, Any] = {
                    **base,
                    "choices": [{"index": c.index, "delta": {"role": "assistant", "content": ""}}],
                }
                if want_ids and c.index == 0:
                    first[semconv.RESPONSE_PROMPT_TOKEN_IDS] = prompt_ids
                out.append(first)
                for piece, ids in self._pieces(c.text):
                    ch: dict[str, Any] = {
                        "index": c.index,
                        "delta": {"content": piece},
                        "finish_reason": None,
                    }
                    if want_logprobs:
                        ch["logprobs"] = {"content": _chat_logprobs(ids, top_n)}
                    if want_ids:
                        ch[semconv.RESPONSE_CHOICE_TOKEN_IDS] = ids
                    out.append({**base, "choices": [ch]})
                out.append(
                    {**base, "choices": [{"index": c.index, "delta": {}, "finish_reason": c.finish_reason}]}
                )
            if usage_in_stream:
                out.append({**base, "choices": [], "usage": usage})
            return out

        return self._sse(chunks())

    async def _completions(self, request: Request) -> Response:
        body = await self._read(request)
        if isinstance(body, Response):
            return body
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and 0 <= t < 256 for t in prompt):
            prompt_ids = list(prompt)
            prompt = bytes(prompt_ids).decode(errors="replace")
        elif isinstance(prompt, str):
            prompt_ids = self._encode(prompt)
        else:
            return _error(400, "'prompt' must be a string or a list of byte token ids (0..255)")
        common = self._common(body)
        if isinstance(common, Response):
            return common
        n, max_tokens, want_ids, stream, usage_in_stream = common
        logprobs_n = body.get("logprobs")
        want_logprobs = logprobs_n is not None and logprobs_n is not False and self.options.logprobs
        top_n = int(logprobs_n or 0) if want_logprobs else 0
        model = str(body.get("model") or self.options.model)
        req = ReplyRequest("completion", model, body, None, prompt, 0)
        choices, rid, usage, extra = self._answer(req, n, max_tokens, len(prompt_ids), "cmpl")
        if not stream:
            out_choices = []
            for c in choices:
                choice: dict[str, Any] = {
                    "index": c.index,
                    "text": c.text,
                    "finish_reason": c.finish_reason,
                    "logprobs": _completion_logprobs(c.ids, top_n) if want_logprobs else None,
                }
                if want_ids:
                    choice[semconv.RESPONSE_PROMPT_TOKEN_IDS] = prompt_ids
                    choice[semconv.RESPONSE_CHOICE_TOKEN_IDS] = c.ids
                out_choices.append(choice)
            payload = {
                "id": rid,
                "object": "text_completion",
                "created": int(time.time()),
                "model": model,
                "choices": out_choices,
                "usage": usage,
                **extra,
            }
            return JSONResponse(payload, headers=self._headers())

        def chunks() -> list[dict[str, Any]]:
            base = {
                "id": rid,
                "object": "text_completion",
                "created": int(time.time()),
                "model": model,
                **extra,
            }
            out: list[dict[str, Any]] = []
            for c in choices:
                pieces = self._pieces(c.text)
                for k, (piece, ids) in enumerate(pieces):
                    last = k == len(pieces) - 1
                    ch: dict[str, Any] = {
                        "index": c.index,
                        "text": piece,
                        "finish_reason": c.finish_reason if last else None,
                        "logprobs": _completion_logprobs(ids, top_n) if want_logprobs else None,
                    }
                    if want_ids:
                        if k == 0:
                            ch[semconv.RESPONSE_PROMPT_TOKEN_IDS] = prompt_ids
                        ch[semconv.RESPONSE_CHOICE_TOKEN_IDS] = ids
                    out.append({**base, "choices": [ch]})
                if not pieces:
                    out.append(
                        {
                            **base,
                            "choices": [{"index": c.index, "text": "", "finish_reason": c.finish_reason}],
                        }
                    )
            if usage_in_stream:
                out.append({**base, "choices": [], "usage": usage})
            return out

        return self._sse(chunks())

    async def _responses(self, request: Request) -> Response:
        from tinkertrace.testing.responses_route import answer

        body = await self._read(request)
        return body if isinstance(body, Response) else answer(self, body)

    def _sse(self, chunks: list[dict[str, Any]]) -> Response:
        delay = self.options.latency_s / 10

        async def events() -> AsyncIterator[bytes]:
            for chunk in chunks:
                if delay:
                    await asyncio.sleep(delay)
                yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers=self._headers())


def _error(status: int, message: str) -> JSONResponse:
    kind = "invalid_request_error" if status == 400 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _pieces(text: str, chars: int) -> list[tuple[str, list[int]]]:
    """Split ``text`` into stream pieces of ``chars`` characters, each with its byte token ids."""
    step = max(1, chars)
    return [(text[i : i + step], list(text[i : i + step].encode())) for i in range(0, len(text), step)]


def _top(token_id: int, top_n: int) -> list[tuple[int, float]]:
    """The sampled token first, then the next ``top_n - 1`` byte values with lower logprobs."""
    alts = [(token_id, byte_logprob(token_id))]
    alts += [((token_id + k) % 256, byte_logprob(token_id) - k) for k in range(1, top_n)]
    return alts[:top_n]


def _chat_logprobs(ids: list[int], top_n: int) -> list[dict[str, Any]]:
    return [
        {
            "token": token_text(t),
            "logprob": byte_logprob(t),
            "bytes": [t],
            "top_logprobs": [
                {"token": token_text(a), "logprob": lp, "bytes": [a]} for a, lp in _top(t, top_n)
            ],
        }
        for t in ids
    ]


def _completion_logprobs(ids: list[int], top_n: int) -> dict[str, Any]:
    return {
        "tokens": [token_text(t) for t in ids],
        "token_logprobs": [byte_logprob(t) for t in ids],
        "top_logprobs": [{token_text(a): lp for a, lp in _top(t, top_n)} for t in ids] if top_n else None,
        "text_offset": list(range(len(ids))),  # one byte per token
    }


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
