"""A stand-in for the *hosted* Tinker SamplingClient (unreachable from tests) with scripted replies.

It answers ``sample`` with real ``tinker.types`` objects through a real ``concurrent.futures``
future, so the sampling endpoint runs exactly as against hosted Tinker while the sampled text (tool
calls included) is known in advance.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from tinker import types
from tinker.lib.public_interfaces.api_future import AwaitableConcurrentFuture
from tinker.types.topk_logprobs import TopkLogprobs

from tinkertrace.models.tokenizer import BUILTIN_MODEL, load_tokenizer

Replier = Callable[[list[int]], str]
"""Prompt token ids -> the reply's text."""


class ScriptedTinkerSampler:
    """A hosted-Tinker SamplingClient double replying with scripted texts (cycled per sample), or with
    what ``replies(prompt_ids)`` returns when it is a function. Each sample is the reply's tokens
    and the end-of-turn token, cut at ``max_tokens``; logprobs are a fixed function of the token."""

    def __init__(self, replies: list[str] | Replier, *, latency_s: float = 0.0, tag: int = 0) -> None:
        self.tokenizer = load_tokenizer(BUILTIN_MODEL)
        self._replier = replies if callable(replies) else None
        self._replies = itertools.cycle([] if callable(replies) else replies)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=4)
        self.latency_s = latency_s
        self.tag = tag
        self.calls: list[tuple[list[int], int, types.SamplingParams, int]] = []

    def _one(self, prompt_ids: list[int], max_tokens: int, topk: int) -> types.SampledSequence:
        with self._lock:
            reply = self._replier(prompt_ids) if self._replier else next(self._replies)
        ids = [*self.tokenizer.encode(reply, add_special_tokens=False), self.tokenizer.eos_token_id]
        stop: types.StopReason = "stop"
        if len(ids) > max_tokens:
            ids, stop = ids[:max_tokens], "length"
        tokens = np.asarray(ids, dtype=np.int32)
        logprobs = -((tokens % 16) + 1).astype(np.float32) / 16
        topk_lp = None
        if topk:
            alt = (tokens[:, None] + np.arange(topk)[None, :]) % 256
            topk_lp = TopkLogprobs(
                token_ids=alt.astype(np.int32),
                logprobs=(logprobs[:, None] - np.arange(topk)[None, :]).astype(np.float32),
            )
        return types.SampledSequence(
            stop_reason=stop,
            sequence_id="seq",
            tokens_np=tokens,
            logprobs_np=logprobs,
            topk_logprobs_np=topk_lp,
        )

    def sample(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        sampling_params: types.SamplingParams,
        topk_sample_logprobs: int = 0,
        **_: Any,
    ) -> AwaitableConcurrentFuture:
        prompt_ids = prompt.to_ints()
        self.calls.append((prompt_ids, num_samples, sampling_params, topk_sample_logprobs))

        def run() -> types.SampleResponse:
            if self.latency_s:
                time.sleep(self.latency_s)
            max_tokens = sampling_params.max_tokens or 10_000
            seqs = [self._one(prompt_ids, max_tokens, topk_sample_logprobs) for _ in range(num_samples)]
            return types.SampleResponse(sequences=seqs)

        return AwaitableConcurrentFuture(self._pool.submit(run))
