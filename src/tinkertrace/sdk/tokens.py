"""The RL data of an LLM span: prompt ids, response ids and logprobs, packed, with their source.

Server ids (vLLM-style ``return_token_ids``) are exactly what was sampled and are preferred. When the
server returns none, the configured tokenizer re-tokenises (the chat template for the prompt) and
the span says ``token_source = retokenized``; with no tokenizer the span carries no ids and says
``token_source = none``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tinkertrace import semconv
from tinkertrace.packing import pack_ids, pack_logprobs
from tinkertrace.sdk import responses_api
from tinkertrace.sdk.response_parse import ResponseRecord


def _ids(result: Any) -> list[int]:
    """Token ids from ``apply_chat_template``/``encode`` (a list, or a mapping with ``input_ids``)."""
    if isinstance(result, Mapping) or hasattr(result, "input_ids"):
        result = result["input_ids"]
    return list(result)


def retokenize_prompt(tokenizer: Any, kind: str, body: dict[str, Any]) -> list[int] | None:
    """The prompt's ids: the chat template (generation prompt added) or the encoded prompt text."""
    if kind in ("chat", "responses"):
        messages = body.get("messages") if kind == "chat" else responses_api.input_messages(body)
        if not isinstance(messages, list):
            return None
        kwargs: dict[str, Any] = {"add_generation_prompt": True, "tokenize": True}
        tools = body.get("tools") if kind == "chat" else responses_api.chat_tools(body.get("tools"))
        if tools:
            kwargs["tools"] = tools
        return _ids(tokenizer.apply_chat_template(messages, **kwargs))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, str):
        return _ids(tokenizer.encode(prompt, add_special_tokens=False))
    return None


def prompt_ids_given(kind: str, body: dict[str, Any]) -> list[int] | None:
    """A completion request whose prompt is already token ids."""
    prompt = body.get("prompt")
    if kind != "chat" and isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return prompt
    return None


def token_attributes(rt: Any, kind: str, body: dict[str, Any], record: ResponseRecord) -> dict[str, Any]:
    """Span attributes with the packed ids and logprobs of choice 0 and where they came from."""
    choice = record.choices.get(0)
    if choice is None:
        return {}
    prompt_ids = record.prompt_token_ids or prompt_ids_given(kind, body)
    response_ids = choice.token_ids
    logprobs = choice.logprobs
    if response_ids is not None:
        source = semconv.SOURCE_SERVER
        if prompt_ids is None and (tok := rt.tokenizer()) is not None:
            prompt_ids = retokenize_prompt(tok, kind, body)
    else:
        tok = rt.tokenizer()
        if tok is None:
            return {semconv.TOKEN_SOURCE: semconv.SOURCE_NONE}
        source = semconv.SOURCE_RETOKENIZED
        if prompt_ids is None:
            prompt_ids = retokenize_prompt(tok, kind, body)
        response_ids = _ids(tok.encode("".join(choice.text), add_special_tokens=False))
    attrs: dict[str, Any] = {
        semconv.TOKEN_SOURCE: source,
        semconv.TOKEN_ENCODING: semconv.ENCODING_PACKED,
        semconv.RESPONSE_TOKEN_IDS: pack_ids(response_ids),
    }
    if prompt_ids is not None:
        attrs[semconv.PROMPT_TOKEN_IDS] = pack_ids(prompt_ids)
    if logprobs is not None and len(logprobs) == len(response_ids):
        attrs[semconv.RESPONSE_LOGPROBS] = pack_logprobs(logprobs)
    runs = record.version_runs()
    if source == semconv.SOURCE_SERVER and runs and sum(runs[1::2]) == len(response_ids):
        attrs[semconv.POLICY_VERSION_RUNS] = runs  # each response token's policy version
    return attrs
