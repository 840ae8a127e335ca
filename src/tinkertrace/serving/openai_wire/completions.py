"""``chat.completion``, ``chat.completion.chunk``, ``text_completion`` and ``/v1/models`` objects.

Built from decoded :class:`Choice` objects, with vLLM's token-id extension: ``prompt_token_ids``
(top level for chat, per choice for completions) and ``choices[].token_ids``, sent when
``token_ids`` is true (vLLM sends them when a request asks with ``return_token_ids``). ``extra``
fields go into every object's envelope (the endpoint's ``policy_version``). A stream is the same
choices cut by ``split`` into the pieces sent one per chunk, each piece with its own token ids and
logprobs.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from tinkertrace import semconv
from tinkertrace.serving.tool_parsers import ToolCall


@dataclass(frozen=True)
class Choice:
    """One sampled sequence, decoded (or a piece of one, when streamed)."""

    text: str
    token_ids: list[int]
    logprobs: list[float] | None
    token_texts: list[str] | None  # display string of each sampled token (when logprobs were asked)
    top_logprobs: list[list[tuple[str, float]]] | None  # per token: (token text, logprob), best first
    finish_reason: str
    prompt_token_ids: list[int]
    tool_calls: tuple[ToolCall, ...] = ()  # parsed from the text, which then holds only the content
    policy_versions: list[int] | None = None  # per token: the policy version that sampled it

    def version_runs(self) -> list[int] | None:
        """``policy_versions`` as flat ``[version, count, ...]`` runs (``semconv.POLICY_VERSION_RUNS``)."""
        if self.policy_versions is None:
            return None
        runs: list[int] = []
        for version in self.policy_versions:
            if runs and runs[-2] == version:
                runs[-1] += 1
            else:
                runs += [version, 1]
        return runs

    def version_fields(self, fallback: int) -> dict[str, Any]:
        """The wire's ``policy_version`` (of the first token; ``fallback`` when there is none) and
        ``policy_version_runs`` (when known)."""
        runs = self.version_runs()
        fields: dict[str, Any] = {semconv.RESPONSE_POLICY_VERSION: runs[0] if runs else fallback}
        if runs is not None:
            fields[semconv.RESPONSE_POLICY_VERSION_RUNS] = runs
        return fields

    def piece(self, start: int, end: int, text: str) -> Choice:
        """Tokens ``start:end`` of this choice (with their logprobs) as a stream piece showing ``text``."""

        def cut(values: list[Any] | None) -> list[Any] | None:
            return None if values is None else values[start:end]

        return replace(
            self,
            text=text,
            token_ids=self.token_ids[start:end],
            logprobs=cut(self.logprobs),
            token_texts=cut(self.token_texts),
            top_logprobs=cut(self.top_logprobs),
            policy_versions=cut(self.policy_versions),
        )


Split = Callable[[Choice], list[Choice]]


def whole(choice: Choice) -> list[Choice]:
    """The default ``split``: a choice streamed as one piece."""
    return [choice]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _envelope(kind: str, rid: str, model: str, extra: dict[str, Any] | None) -> dict[str, Any]:
    return {"id": rid, "object": kind, "created": int(time.time()), "model": model, **(extra or {})}


def token_logprobs(choice: Choice) -> list[dict[str, Any]]:
    """Each sampled token with its logprob and top alternatives, in OpenAI's shape (chat
    ``logprobs.content`` and Responses ``output_text.logprobs`` alike); empty without logprobs."""
    if choice.logprobs is None or choice.token_texts is None:
        return []
    tops = choice.top_logprobs or [[] for _ in choice.logprobs]
    return [
        {
            "token": text,
            "logprob": lp,
            "bytes": list(text.encode()),
            "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in top],
        }
        for text, lp, top in zip(choice.token_texts, choice.logprobs, tops, strict=True)
    ]


def _chat_logprobs(choice: Choice) -> dict[str, Any] | None:
    if choice.logprobs is None or choice.token_texts is None:
        return None
    return {"content": token_logprobs(choice), "refusal": None}


def _completion_logprobs(choice: Choice, top_n: int) -> dict[str, Any] | None:
    if choice.logprobs is None or choice.token_texts is None:
        return None
    offsets, pos = [], 0
    for text in choice.token_texts:
        offsets.append(pos)
        pos += len(text)
    tops = None
    if top_n and choice.top_logprobs is not None:
        tops = [dict(top[:top_n]) for top in choice.top_logprobs]
    return {
        "tokens": choice.token_texts,
        "token_logprobs": choice.logprobs,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def _chat_message(c: Choice) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": c.text if c.text or not c.tool_calls else None,
        "refusal": None,
    }
    if c.tool_calls:
        message["tool_calls"] = [call.as_openai() for call in c.tool_calls]
    return message


def _tool_call_deltas(c: Choice) -> list[dict[str, Any]]:
    """Per call, like vLLM: a delta with id, type and name, then one with the arguments."""
    deltas = []
    for k, call in enumerate(c.tool_calls):
        head = {
            "index": k,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        deltas.append({"tool_calls": [head]})
        deltas.append({"tool_calls": [{"index": k, "function": {"arguments": call.arguments}}]})
    return deltas


def chat_response(
    rid: str,
    model: str,
    choices: list[Choice],
    *,
    token_ids: bool = True,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A complete ``chat.completion`` object."""
    prompt_ids = choices[0].prompt_token_ids
    out_choices = []
    for i, c in enumerate(choices):
        choice = {
            "index": i,
            "message": _chat_message(c),
            "logprobs": _chat_logprobs(c),
            "finish_reason": c.finish_reason,
        }
        if token_ids:
            choice[semconv.RESPONSE_CHOICE_TOKEN_IDS] = c.token_ids
        _add_runs(choice, c)
        out_choices.append(choice)
    body = {
        **_envelope("chat.completion", rid, model, extra),
        "choices": out_choices,
        "usage": usage(len(prompt_ids), sum(len(c.token_ids) for c in choices)),
    }
    if token_ids:
        body[semconv.RESPONSE_PROMPT_TOKEN_IDS] = prompt_ids
    return body


def _chat_deltas(c: Choice, split: Split) -> list[tuple[dict[str, Any], Choice | None]]:
    """The deltas of one choice, each with the piece whose token ids and logprobs it carries: the
    text pieces, then two deltas per tool call (id and name, then arguments). With no text but tool
    calls, the first tool-call delta carries the whole choice's ids."""
    carried = [({"content": p.text}, p) for p in split(c)] if c.text or not c.tool_calls else []
    calls: list[tuple[dict[str, Any], Choice | None]] = [(d, None) for d in _tool_call_deltas(c)]
    if not carried and calls:
        carried, calls = [(calls[0][0], c)], calls[1:]
    return [*carried, *calls]


def chat_chunks(
    rid: str,
    model: str,
    choices: list[Choice],
    *,
    include_usage: bool,
    token_ids: bool = True,
    extra: dict[str, Any] | None = None,
    split: Split = whole,
) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a streamed chat answer (without ``[DONE]``).

    Per choice: a role chunk, one chunk per delta (see :func:`_chat_deltas`), a finish chunk. The
    first chunk carries ``prompt_token_ids``; with ``include_usage`` every chunk has ``usage: null``
    and a last chunk with no choices carries the usage.
    """
    base = _envelope("chat.completion.chunk", rid, model, extra)
    if include_usage:
        base["usage"] = None
    out: list[dict[str, Any]] = []
    for i, c in enumerate(choices):
        role = {
            "index": i,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        first = {**base, "choices": [role]}
        if i == 0 and token_ids:
            first[semconv.RESPONSE_PROMPT_TOKEN_IDS] = c.prompt_token_ids
        out.append(first)
        for delta, piece in _chat_deltas(c, split):
            chunk: dict[str, Any] = {"index": i, "delta": delta, "logprobs": None, "finish_reason": None}
            if piece is not None:
                chunk["logprobs"] = _chat_logprobs(piece)
                if token_ids:
                    chunk[semconv.RESPONSE_CHOICE_TOKEN_IDS] = piece.token_ids
            out.append({**base, "choices": [chunk]})
        finish = {"index": i, "delta": {}, "logprobs": None, "finish_reason": c.finish_reason}
        out.append({**base, "choices": [_add_runs(finish, c)]})
    if include_usage:
        prompt_tokens = len(choices[0].prompt_token_ids)
        out.append(
            {**base, "choices": [], "usage": usage(prompt_tokens, sum(len(c.token_ids) for c in choices))}
        )
    return out


def _completion_usage(choices: list[Choice], n: int) -> dict[str, int]:
    prompt_tokens = sum(len(c.prompt_token_ids) for c in choices[::n])
    return usage(prompt_tokens, sum(len(c.token_ids) for c in choices))


def _add_runs(choice: dict[str, Any], c: Choice) -> dict[str, Any]:
    """``choice`` (a wire object) with the whole choice's ``policy_version_runs``, when known."""
    runs = c.version_runs()
    if runs is not None:
        choice[semconv.RESPONSE_POLICY_VERSION_RUNS] = runs
    return choice


def _completion_choice(
    i: int, c: Choice, top_n: int, *, token_ids: bool, finish: str | None, prompt_ids: bool = True
) -> dict[str, Any]:
    choice = {"index": i, "text": c.text, "logprobs": _completion_logprobs(c, top_n), "finish_reason": finish}
    if token_ids:
        if prompt_ids:
            choice[semconv.RESPONSE_PROMPT_TOKEN_IDS] = c.prompt_token_ids
        choice[semconv.RESPONSE_CHOICE_TOKEN_IDS] = c.token_ids
    return choice


def completion_response(
    rid: str,
    model: str,
    choices: list[Choice],
    n: int,
    top_n: int,
    *,
    token_ids: bool = True,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A complete ``text_completion`` object; ``choices`` are prompt-major (prompt i, sample j at i*n+j)."""
    return {
        **_envelope("text_completion", rid, model, extra),
        "choices": [
            _add_runs(_completion_choice(i, c, top_n, token_ids=token_ids, finish=c.finish_reason), c)
            for i, c in enumerate(choices)
        ],
        "usage": _completion_usage(choices, n),
    }


def completion_chunks(
    rid: str,
    model: str,
    choices: list[Choice],
    n: int,
    top_n: int,
    *,
    include_usage: bool,
    token_ids: bool = True,
    extra: dict[str, Any] | None = None,
    split: Split = whole,
) -> list[dict[str, Any]]:
    """The chunks of a streamed completion: per choice one chunk per piece (its text, ids and
    logprobs; the prompt ids on the first, the finish reason on the last)."""
    base = _envelope("text_completion", rid, model, extra)
    if include_usage:
        base["usage"] = None
    out = []
    for i, c in enumerate(choices):
        pieces = split(c) or [c]
        for k, piece in enumerate(pieces):
            last = k == len(pieces) - 1
            chunk = _completion_choice(
                i,
                piece,
                top_n,
                token_ids=token_ids,
                finish=c.finish_reason if last else None,
                prompt_ids=k == 0,
            )
            out.append({**base, "choices": [_add_runs(chunk, c) if last else chunk]})
    if include_usage:
        out.append({**base, "choices": [], "usage": _completion_usage(choices, n)})
    return out


def models_list(
    names: str | tuple[str, ...],
    created: int,
    extra: dict[str, Any] | None = None,
    *,
    context_length: int | None = None,
) -> dict[str, Any]:
    """``GET /v1/models``: the served model under each of its names, with its context length (as
    vLLM reports it, ``max_model_len``, and as OpenRouter and LiteLLM read it, ``context_length``)
    where known."""
    window = (
        {} if context_length is None else {"max_model_len": context_length, "context_length": context_length}
    )
    entries = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "tinkertrace",
            **window,
            **(extra or {}),
        }
        for name in ((names,) if isinstance(names, str) else names)
    ]
    return {"object": "list", "data": entries}
