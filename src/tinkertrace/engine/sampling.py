"""The local SamplingClient: `sample` and `compute_logprobs` over a frozen model snapshot.

Returned log-probabilities are those of the distribution the token was drawn from:
``log_softmax(logits / temperature)`` before top-k/top-p truncation (so at temperature 1 they are
the model's own log-probabilities and match `TrainingClient.forward` on the same tokens). A
temperature of 0 means greedy decoding and reports temperature-1 log-probabilities.
Generation stops at the tokenizer's end-of-sequence token, at any ``stop`` token id, or once the
decoded text contains a ``stop`` string; the stopping token is kept in ``tokens``.
"""

from __future__ import annotations

import numbers
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tinker import types
from tinker.lib.public_interfaces.api_future import APIFuture
from tinker.types.topk_logprobs import MASK_LOGPROB, TopkLogprobs
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tinkertrace.engine.futures import OrderedWorker
from tinkertrace.engine.model import freeze, load_base_model
from tinkertrace.engine.storage import SAMPLER_WEIGHTS, CheckpointStore
from tinkertrace.tokenizer import load_tokenizer

DEFAULT_MAX_TOKENS = 256
"""Tokens generated when ``SamplingParams.max_tokens`` is None."""


def prompt_tokens(prompt: types.ModelInput) -> list[int]:
    """The token ids of a text-only ModelInput; ValueError for image or other chunks."""
    for chunk in prompt.chunks:
        if not isinstance(chunk, types.EncodedTextChunk):
            raise ValueError(f"the local engine takes token chunks only, got a {type(chunk).__name__}")
    tokens = prompt.to_ints()
    if not tokens:
        raise ValueError("prompt is empty")
    return tokens


def context_length(model: PreTrainedModel) -> int:
    """The model's maximum sequence length."""
    return int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)


def stop_conditions(
    stop: str | Sequence[str] | Sequence[int] | None, tokenizer: PreTrainedTokenizerBase
) -> tuple[set[int], list[str]]:
    """Split ``SamplingParams.stop`` into stop token ids (plus end-of-sequence ids) and stop strings."""
    token_ids: set[int] = set()
    eos = tokenizer.eos_token_id
    if isinstance(eos, int):
        token_ids.add(eos)
    strings: list[str] = []
    if stop is None:
        return token_ids, strings
    items: Sequence[str | int] = [stop] if isinstance(stop, str) else list(stop)
    for item in items:
        if isinstance(item, str):
            if item:
                strings.append(item)
        elif isinstance(item, numbers.Integral) and not isinstance(item, bool):
            token_ids.add(int(item))
        else:
            raise ValueError(f"stop entries must be strings or token ids, got {item!r}")
    return token_ids, strings


def _filter_logprobs(logprobs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) tokens outside the top-k and the top-p nucleus; rows are [n, vocab]."""
    if 0 < top_k < logprobs.shape[-1]:
        kth = torch.topk(logprobs, top_k, dim=-1).values[..., -1:]
        logprobs = logprobs.masked_fill(logprobs < kth, float("-inf"))
    if 0.0 < top_p < 1.0:
        sorted_lp, order = torch.sort(logprobs, dim=-1, descending=True)
        probs = sorted_lp.exp()
        before = probs.cumsum(dim=-1) - probs  # mass strictly above each token
        drop_sorted = before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logprobs = logprobs.masked_fill(drop, float("-inf"))
    return logprobs


def _new_sequence_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class PromptScoreRequest:
    """Which scores of the prompt a request wants (``SamplingClient.sample``'s prompt arguments)."""

    include_logprobs: bool = False
    topk: int = 0
    target: types.TensorData | None = None
    last_n: int | None = None

    @property
    def wanted(self) -> bool:
        return self.include_logprobs or self.topk > 0 or self.target is not None

    def check(self, prompt_length: int, vocab_size: int) -> None:
        """ValueError naming what the server refuses, before any work is queued."""
        if self.last_n is not None and not 1 <= self.last_n <= prompt_length - 1:
            raise ValueError(f"prompt_logprobs_last_n must be in [1, {prompt_length - 1}], got {self.last_n}")
        if not 0 <= self.topk <= vocab_size:
            raise ValueError(f"topk_prompt_logprobs must be in [0, {vocab_size}], got {self.topk}")
        if self.target is None:
            return
        shape = self.target.shape or []
        if self.target.dtype != "int64" or len(shape) != 2 or shape[0] != prompt_length - 1:
            raise ValueError(
                f"target_prompt_logprobs must be an int64 tensor of shape [{prompt_length - 1}, K] "
                f"(len(prompt) - 1 rows), got {self.target.dtype} {shape}"
            )
        ids = self.target.to_numpy(pad_value=-1)
        if ids.size and (ids.min() < -1 or ids.max() >= vocab_size):
            raise ValueError(f"target_prompt_logprobs ids must be -1 (none) or in [0, {vocab_size})")


@dataclass
class PromptScores:
    """One forward pass's scores of a prompt: ``logprobs`` of each token (NaN for the first, and before
    the last ``last_n``), the ``topk`` most likely tokens at each position (sentinel rows where not
    scored), and the ``target`` ids' log-probabilities in the request's layout."""

    logprobs: np.ndarray
    topk: TopkLogprobs | None = None
    target: types.TensorData | None = None


@torch.inference_mode()
def prompt_scores(model: PreTrainedModel, tokens: list[int], request: PromptScoreRequest) -> PromptScores:
    """Score ``tokens`` with one forward pass: position ``i`` is scored from ``log_softmax`` of the
    logits after tokens ``[:i]`` — the same numbers ``TrainingClient.forward`` reports."""
    device = next(model.parameters()).device
    n = len(tokens)
    first_scored = 1 if request.last_n is None else n - request.last_n
    logprobs = np.full(n, np.nan, dtype=np.float32)
    if n < 2:
        return PromptScores(logprobs)
    ids = torch.tensor([tokens], dtype=torch.long, device=device)
    rows = torch.log_softmax(model(input_ids=ids[:, :-1]).logits[0].float(), dim=-1)  # row i scores i + 1
    logprobs[1:] = rows.gather(-1, ids[0, 1:, None])[:, 0].cpu().numpy()
    logprobs[:first_scored] = np.nan
    scores = PromptScores(logprobs)
    if request.topk:
        values, top_ids = torch.topk(rows, request.topk, dim=-1)
        token_ids = np.zeros((n, request.topk), dtype=np.int32)
        top_lp = np.full((n, request.topk), MASK_LOGPROB, dtype=np.float32)
        token_ids[first_scored:] = top_ids[first_scored - 1 :].cpu().numpy()
        top_lp[first_scored:] = values[first_scored - 1 :].cpu().numpy()
        scores.topk = TopkLogprobs(token_ids=token_ids, logprobs=top_lp)
    if request.target is not None:
        target_ids = torch.as_tensor(request.target.to_numpy(pad_value=-1), device=device)
        picked = rows.gather(-1, target_ids.clamp(min=0)).masked_fill(target_ids < 0, 0.0).cpu().numpy()
        scores.target = _in_layout_of(request.target, picked)
    return scores


def _in_layout_of(target: types.TensorData, values: np.ndarray) -> types.TensorData:
    """``values`` (dense ``[rows, K]``) as float32 TensorData laid out like ``target`` (dense or CSR)."""
    if target.sparse_crow_indices is None or target.sparse_col_indices is None:
        return types.TensorData(data=values, dtype="float32", shape=list(values.shape))
    crow = np.asarray(target.sparse_crow_indices, dtype=np.int64)
    row_of_entry = np.repeat(np.arange(len(crow) - 1), np.diff(crow))
    picked = values[row_of_entry, np.asarray(target.sparse_col_indices, dtype=np.int64)]
    return types.TensorData(
        data=picked,
        dtype="float32",
        shape=list(values.shape),
        sparse_crow_indices=list(target.sparse_crow_indices),
        sparse_col_indices=list(target.sparse_col_indices),
    )


@torch.inference_mode()
def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt: list[int],
    num_samples: int,
    params: types.SamplingParams,
    topk: int = 0,
) -> list[types.SampledSequence]:
    """Sample ``num_samples`` continuations of ``prompt`` in one batch with a KV cache.

    ``topk`` > 0 also returns, per sampled token, the ``topk`` most likely tokens of the distribution
    it was drawn from (``SampledSequence.topk_logprobs``)."""
    if num_samples < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    if params.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {params.temperature}")
    if not 0.0 < params.top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
    room = context_length(model) - len(prompt)
    if room < 1:
        raise ValueError(
            f"prompt of {len(prompt)} tokens leaves no room in the {context_length(model)}-token context"
        )
    max_new = DEFAULT_MAX_TOKENS if params.max_tokens is None else params.max_tokens
    if max_new < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_new}")
    if not 0 <= topk <= int(model.config.vocab_size):
        raise ValueError(f"topk_sample_logprobs must be in [0, {model.config.vocab_size}], got {topk}")
    max_new = min(max_new, room)
    stop_ids, stop_strings = stop_conditions(params.stop, tokenizer)
    tail = max((len(s) for s in stop_strings), default=0) + 4

    device = next(model.parameters()).device
    generator = torch.Generator(device=device)
    if params.seed is not None:
        generator.manual_seed(int(params.seed))
    else:
        generator.seed()
    stop_tensor = torch.tensor(sorted(stop_ids), dtype=torch.long, device=device)

    ids = torch.tensor(prompt, dtype=torch.long, device=device).unsqueeze(0).expand(num_samples, -1)
    out = model(input_ids=ids, use_cache=True)
    past, logits = out.past_key_values, out.logits[:, -1].float()
    tokens = torch.empty((num_samples, max_new), dtype=torch.long, device=device)
    logprobs = torch.empty((num_samples, max_new), dtype=torch.float32, device=device)
    top_values = torch.empty((num_samples, max_new, topk), dtype=torch.float32, device=device)
    top_ids = torch.empty((num_samples, max_new, topk), dtype=torch.long, device=device)
    lengths = np.full(num_samples, max_new)
    stopped = np.zeros(num_samples, dtype=bool)
    for step in range(max_new):
        if params.temperature == 0:
            lp = torch.log_softmax(logits, dim=-1)
            tok = lp.argmax(dim=-1)
        else:
            lp = torch.log_softmax(logits / params.temperature, dim=-1)
            probs = _filter_logprobs(lp, params.top_k, params.top_p).exp()
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        tokens[:, step] = tok
        logprobs[:, step] = lp.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
        if topk:
            top_values[:, step], top_ids[:, step] = torch.topk(lp, topk, dim=-1)
        hit = torch.isin(tok, stop_tensor).cpu().numpy() if len(stop_ids) else np.zeros(num_samples, bool)
        if stop_strings:
            for row in np.flatnonzero(~stopped & ~hit):
                text = tokenizer.decode(tokens[row, max(0, step + 1 - tail) : step + 1].tolist())
                hit[row] = any(s in text for s in stop_strings)
        newly = hit & ~stopped
        lengths[newly] = step + 1
        stopped |= newly
        if stopped.all() or step + 1 == max_new:
            break
        out = model(input_ids=tok.unsqueeze(-1), past_key_values=past, use_cache=True)
        past, logits = out.past_key_values, out.logits[:, -1].float()

    tokens_np = tokens.cpu().numpy().astype(np.int32)
    logprobs_np = logprobs.cpu().numpy()
    top_ids_np = top_ids.cpu().numpy().astype(np.int32) if topk else None
    top_values_np = top_values.cpu().numpy() if topk else None
    return [
        types.SampledSequence(
            stop_reason="stop" if stopped[i] else "length",
            sequence_id=_new_sequence_id(),
            tokens_np=tokens_np[i, : lengths[i]].copy(),
            logprobs_np=logprobs_np[i, : lengths[i]].copy(),
            topk_logprobs_np=TopkLogprobs(
                token_ids=top_ids_np[i, : lengths[i]].copy(), logprobs=top_values_np[i, : lengths[i]].copy()
            )
            if top_ids_np is not None and top_values_np is not None
            else None,
        )
        for i in range(num_samples)
    ]


class SamplingClient:
    """Samples from a frozen model snapshot; same methods and return types as `tinker.SamplingClient`."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        base_model: str,
        model_path: str | None = None,
    ) -> None:
        self._model = model
        self._tokenizer = tokenizer
        self._base_model = base_model
        self.model_path = model_path
        self._worker = OrderedWorker("tinkertrace-sampler")

    def sample(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        sampling_params: types.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        topk_sample_logprobs: int = 0,
        target_prompt_logprobs: types.TensorData | None = None,
        prompt_alt_tokens_k: int = 0,
        prompt_logprobs_last_n: int | None = None,
    ) -> APIFuture[types.SampleResponse]:
        """Generate ``num_samples`` completions of ``prompt``; a future of a `SampleResponse`.

        Prompt scores come from one forward pass over the prompt (see :func:`prompt_scores`):
        ``include_prompt_logprobs``, ``topk_prompt_logprobs`` (the k most likely tokens at each
        position; both limited to the last ``prompt_logprobs_last_n`` positions when set) and
        ``target_prompt_logprobs`` (the log-probabilities of chosen token ids, ``[len(prompt) - 1, K]``,
        ``-1`` = none; dense or sparse CSR, answered in the same layout)."""
        if prompt_alt_tokens_k:
            raise ValueError("prompt_alt_tokens_k is not supported by the local engine")
        tokens = prompt_tokens(prompt)
        request = PromptScoreRequest(
            include_prompt_logprobs, topk_prompt_logprobs, target_prompt_logprobs, prompt_logprobs_last_n
        )
        request.check(len(tokens), int(self._model.config.vocab_size))
        return self._worker.submit(
            self._sample, tokens, num_samples, sampling_params, request, topk_sample_logprobs
        )

    def _sample(
        self,
        tokens: list[int],
        num_samples: int,
        params: types.SamplingParams,
        scores: PromptScoreRequest,
        topk: int = 0,
    ) -> types.SampleResponse:
        sequences = generate(self._model, self._tokenizer, tokens, num_samples, params, topk)
        if not scores.wanted:
            return types.SampleResponse(sequences=sequences)
        scored = prompt_scores(self._model, tokens, scores)
        return types.SampleResponse(
            sequences=sequences,
            prompt_logprobs_np=scored.logprobs if scores.include_logprobs else None,
            topk_prompt_logprobs_np=scored.topk,
            target_prompt_logprobs=scored.target,
        )

    def compute_logprobs(
        self, prompt: types.ModelInput, prompt_logprobs_last_n: int | None = None
    ) -> APIFuture[list[float | None]]:
        """Log-probability of each prompt token given those before it; None for the first."""
        tokens = prompt_tokens(prompt)
        request = PromptScoreRequest(True, last_n=prompt_logprobs_last_n)
        request.check(len(tokens), int(self._model.config.vocab_size))

        def run() -> list[float | None]:
            arr = prompt_scores(self._model, tokens, request).logprobs
            return [None if np.isnan(x) else float(x) for x in arr]

        return self._worker.submit(run)

    async def sample_async(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        sampling_params: types.SamplingParams,
        **kwargs: object,
    ) -> types.SampleResponse:
        """Awaitable `sample`."""
        return await self.sample(prompt, num_samples, sampling_params, **kwargs)  # type: ignore[arg-type]

    async def compute_logprobs_async(
        self, prompt: types.ModelInput, prompt_logprobs_last_n: int | None = None
    ) -> list[float | None]:
        """Awaitable `compute_logprobs`."""
        return await self.compute_logprobs(prompt, prompt_logprobs_last_n)

    def get_tokenizer(self) -> PreTrainedTokenizerBase:
        return self._tokenizer

    def get_base_model(self) -> str:
        return self._base_model

    @property
    def model(self) -> PreTrainedModel:
        """The frozen snapshot this client samples from."""
        return self._model

    def close(self) -> None:
        """Finish queued requests and stop the worker thread."""
        self._worker.shutdown(wait=True)


def load_sampling_client(store: CheckpointStore, path: str, device: torch.device) -> SamplingClient:
    """A SamplingClient for saved sampler weights (``tinker://run/sampler_weights/name``)."""
    folder, meta = store.resolve(path, expected_kind=SAMPLER_WEIGHTS)
    model = freeze(load_base_model(str(folder), device))
    return SamplingClient(model, load_tokenizer(str(meta["base_model"])), str(meta["base_model"]), path)
