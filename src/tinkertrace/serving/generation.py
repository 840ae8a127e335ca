"""From a validated request to decoded choices: tokenise, sample with a SamplingClient, decode.

Written against Tinker's public ``SamplingClient.sample(prompt, num_samples, sampling_params,
topk_sample_logprobs=...)`` surface, so the hosted client and the local engine both work. The
returned ``token_ids`` are exactly the tokens the sampler produced (cut only where a stop string
ended, as vLLM does), so a trainer can rebuild what was sampled without re-tokenising text.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
from tinker import types

from tinkertrace.serving.batching import SampleBatcher
from tinkertrace.serving.context_window import clamp_max_tokens, context_limit
from tinkertrace.serving.openai_wire.completions import Choice
from tinkertrace.serving.openai_wire.errors import ApiError
from tinkertrace.serving.openai_wire.requests import SamplingOptions
from tinkertrace.serving.policy import Policy, policy_versions

LOGPROB_FLOOR = -9999.0  # stands in for -inf/NaN logprobs, which JSON cannot carry


def sampling_params(options: SamplingOptions, default_max_tokens: int) -> types.SamplingParams:
    """Tinker ``SamplingParams`` for a request. Stop strings are sent along (a backend that honours
    them stops early) and also applied here after decoding (see :meth:`Generator.decode`)."""
    return types.SamplingParams(
        max_tokens=options.max_tokens or default_max_tokens,
        temperature=options.temperature,
        top_p=options.top_p,
        top_k=options.top_k,
        seed=options.seed,
        stop=list(options.stop) or None,
    )


def _find_stop(text: str, stops: tuple[str, ...]) -> int:
    """Index of the earliest stop string in ``text``, or -1."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else -1


class Generator:
    """Tokenises prompts with the policy's tokenizer, samples, and decodes sampled sequences."""

    def __init__(
        self, tokenizer: Any, *, default_max_tokens: int = 256, batcher: SampleBatcher | None = None
    ):
        self.tokenizer = tokenizer
        self.default_max_tokens = default_max_tokens
        self.batcher = batcher or SampleBatcher(window_s=0.0)
        self.vocab_size = len(tokenizer)

    # --- prompts -------------------------------------------------------------------------------------
    def chat_prompt(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, prefix: str = ""
    ) -> list[int]:
        """Token ids of the chat rendered by the tokenizer's chat template, ready for the reply
        (followed by ``prefix``, the start of the reply, when given)."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise ApiError(400, "This model has no chat template: use /v1/completions.", param="messages")
        try:
            text = self.tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=True
            )
        except Exception as exc:  # jinja errors (e.g. the template's raise_exception) are the caller's
            raise ApiError(400, f"The chat template rejected 'messages': {exc}", param="messages") from exc
        return list(self.tokenizer.encode(text + prefix, add_special_tokens=False))

    def text_prompt(self, prompt: str | list[int], index: int) -> list[int]:
        """Token ids of a completions prompt (text is tokenised; ids are checked against the vocab)."""
        if isinstance(prompt, str):
            ids = list(self.tokenizer.encode(prompt, add_special_tokens=True))
        else:
            ids = list(prompt)
            bad = [t for t in ids if t >= self.vocab_size]
            if bad:
                raise ApiError(
                    400,
                    f"Invalid 'prompt': token id {bad[0]} is outside the vocabulary "
                    f"(size {self.vocab_size}).",
                    param="prompt",
                    code="invalid_value",
                )
        if not ids:
            raise ApiError(
                400, f"Invalid 'prompt' ({index}): it has no tokens.", param="prompt", code="invalid_value"
            )
        return ids

    # --- sampling ------------------------------------------------------------------------------------
    async def generate(self, policy: Policy, prompt_ids: list[int], options: SamplingOptions) -> list[Choice]:
        """Sample ``options.n`` sequences for one prompt with ``policy`` and decode them into choices.

        ``max_tokens`` (or the default) is clamped to the room the prompt leaves in the model's context;
        a prompt that leaves none raises :class:`~tinkertrace.serving.context_window.PromptTooLong`."""
        wanted = options.max_tokens or self.default_max_tokens
        limit = context_limit(policy.sampling_client)
        options = replace(options, max_tokens=clamp_max_tokens(wanted, len(prompt_ids), limit))
        params = sampling_params(options, self.default_max_tokens)
        sequences = await self.batcher.sample(
            policy.sampling_client, prompt_ids, options.n, params, options.top_logprobs
        )
        return [self.decode(seq, prompt_ids, options, policy) for seq in sequences]

    def decode(self, seq: Any, prompt_ids: list[int], options: SamplingOptions, policy: Policy) -> Choice:
        """One sampled sequence as a choice: text without special tokens, cut at the first stop string
        (the token ids, logprobs and policy versions are cut after the token that completed it). Each
        token's policy version: :func:`~tinkertrace.serving.policy.policy_versions`."""
        ids = [int(t) for t in seq.tokens]
        versions = policy_versions(seq, policy)
        logprobs = None
        if seq.logprobs is not None:
            arr = np.nan_to_num(
                np.asarray(seq.logprobs, dtype=np.float64), nan=LOGPROB_FLOOR, neginf=LOGPROB_FLOOR
            )
            logprobs = arr.tolist()
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        finish = "stop" if seq.stop_reason == "stop" else "length"
        cut = _find_stop(text, options.stop) if options.stop else -1
        if cut >= 0:
            keep = self._tokens_through_stop(ids, options.stop)
            ids, text, finish, versions = ids[:keep], text[:cut], "stop", versions[:keep]
            logprobs = logprobs[:keep] if logprobs is not None else None
        token_texts = top = None
        if options.logprobs:
            if logprobs is None:
                raise ApiError(500, "The sampler returned no logprobs.", type="server_error")
            token_texts = self.tokenizer.batch_decode([[t] for t in ids])
            top = self._top_logprobs(seq, len(ids), options.top_logprobs)
        return Choice(text, ids, logprobs, token_texts, top, finish, prompt_ids, policy_versions=versions)

    def _tokens_through_stop(self, ids: list[int], stops: tuple[str, ...]) -> int:
        """The fewest leading tokens whose text contains a stop string (binary search over prefixes)."""
        lo, hi = 1, len(ids)
        while lo < hi:
            mid = (lo + hi) // 2
            if _find_stop(self.tokenizer.decode(ids[:mid], skip_special_tokens=True), stops) >= 0:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _top_logprobs(self, seq: Any, length: int, k: int) -> list[list[tuple[str, float]]]:
        """Per sampled token, up to ``k`` (token text, logprob) alternatives; empty lists when the
        backend returned none (``topk_logprobs`` is optional in Tinker's SampledSequence)."""
        topk = getattr(seq, "topk_logprobs", None) if k else None
        if not topk:
            return [[] for _ in range(length)]
        rows = [list(row or [])[:k] for row in topk[:length]]
        rows += [[] for _ in range(length - len(rows))]
        flat = [tid for row in rows for tid, _ in row]
        texts = iter(self.tokenizer.batch_decode([[t] for t in flat]))
        return [[(next(texts), max(float(lp), LOGPROB_FLOOR)) for _, lp in row] for row in rows]
