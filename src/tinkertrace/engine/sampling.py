"""The local SamplingClient: `sample` and `compute_logprobs` over a frozen model snapshot.

Concurrent `sample` calls, with different prompts or the same, are decoded together by one
:class:`~tinkertrace.engine.continuous.ContinuousBatcher` (one forward pass per step for all of
them); each follows the rules of :mod:`tinkertrace.engine.decoding` (log-probabilities of the
distribution sampled from, stop tokens and strings, seeds).

In-flight weights: :meth:`SamplingClient.take_over` moves the sequences another client is decoding
onto this client's weights from their next token (serving's policy swap uses it), and Tinker's
``kind="inflight"`` sampling clients of one training run share one batcher whose weights each save
updates (:meth:`ContinuousBatcher.update_weights`). Sampled sequences name the policy version of
each token (:class:`~tinkertrace.engine.decoding.VersionedSequence`).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np
import torch
from tinker import types
from tinker.lib.public_interfaces.api_future import APIFuture, AwaitableConcurrentFuture
from tinker.types.topk_logprobs import MASK_LOGPROB, TopkLogprobs
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tinkertrace.engine.continuous import ContinuousBatcher
from tinkertrace.engine.decoding import DecodeRequest
from tinkertrace.engine.futures import OrderedWorker
from tinkertrace.engine.model import TRAINABLE_FILE, ModelSpec, freeze, load_base_model, merged_from_state
from tinkertrace.engine.storage import SAMPLER_WEIGHTS, CheckpointStore
from tinkertrace.models.tokenizer import load_tokenizer


def prompt_tokens(prompt: types.ModelInput) -> list[int]:
    """The token ids of a text-only ModelInput; ValueError for image or other chunks."""
    for chunk in prompt.chunks:
        if not isinstance(chunk, types.EncodedTextChunk):
            raise ValueError(f"the local engine takes token chunks only, got a {type(chunk).__name__}")
    tokens = prompt.to_ints()
    if not tokens:
        raise ValueError("prompt is empty")
    return tokens


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


class SamplingClient:
    """Samples from a frozen model snapshot, or from weights updated in flight (``decoder`` shared with
    other clients); same methods and return types as `tinker.SamplingClient`."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        base_model: str,
        model_path: str | None = None,
        *,
        decoder: ContinuousBatcher | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        self._base_model = base_model
        self.model_path = model_path
        self._worker = OrderedWorker("tinkertrace-sampler")
        self.decoder = decoder or ContinuousBatcher(model, tokenizer)

    @property
    def _model(self) -> PreTrainedModel:
        return self.decoder.model

    @property
    def policy_version(self) -> int:
        """The policy version recorded on the tokens this client samples now."""
        return self.decoder.version

    @policy_version.setter
    def policy_version(self, version: int) -> None:
        self.decoder.update_weights(self.decoder.model, version)

    def take_over(self, previous: object, version: int, recompute: bool = False) -> bool:
        """Serve as policy ``version`` and move what ``previous`` (a local SamplingClient of the same
        base model) is decoding onto this client's weights from its next token; with ``recompute``
        their KV cache is rebuilt under these weights first. Both clients then share one batcher
        (unless this one was used already).
        False (nothing moved) for any other client: its sequences finish on their own weights."""
        self.policy_version = version
        if (
            not isinstance(previous, SamplingClient)
            or previous.decoder is self.decoder
            or previous.decoder.closed
            or previous.get_base_model() != self._base_model
        ):
            return False
        previous.decoder.update_weights(self.decoder.model, version, recompute)
        if self.decoder.prefills == 0:  # not used yet: share the batcher (one forward pass for all)
            unused, self.decoder = self.decoder, previous.decoder
            unused.close()
        return True

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
        response: Future[types.SampleResponse] = Future()
        try:  # a bad request fails its future, as a hosted call would
            decode = DecodeRequest.build(
                self._model, self._tokenizer, tokens, num_samples, sampling_params, topk_sample_logprobs
            )
        except ValueError as exc:
            response.set_exception(exc)
            return AwaitableConcurrentFuture(response)
        decoded = self.decoder.submit(decode)
        if request.wanted:
            return self._worker.submit(self._with_prompt_scores, decoded, tokens, request)

        def respond(done: Future[list[types.SampledSequence]]) -> None:
            if (exc := done.exception()) is not None:
                response.set_exception(exc)
            else:
                response.set_result(types.SampleResponse(sequences=done.result()))

        decoded.add_done_callback(respond)
        return AwaitableConcurrentFuture(response)

    def _with_prompt_scores(
        self, decoded: Future[list[types.SampledSequence]], tokens: list[int], request: PromptScoreRequest
    ) -> types.SampleResponse:
        """The decoded sequences with the prompt's scores (one forward pass, on the sampler's worker)."""
        scored = prompt_scores(self._model, tokens, request)
        return types.SampleResponse(
            sequences=decoded.result(),
            prompt_logprobs_np=scored.logprobs if request.include_logprobs else None,
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

    def close(self, cancel: bool = False) -> None:
        """Stop the worker threads: after finishing queued requests, or with ``cancel`` failing them."""
        self.decoder.close(cancel=cancel)
        self._worker.shutdown(wait=True)


def load_sampling_client(store: CheckpointStore, path: str, device: torch.device) -> SamplingClient:
    """A SamplingClient for saved sampler weights (``tinker://run/sampler_weights/name``)."""
    folder, meta = store.resolve(path, expected_kind=SAMPLER_WEIGHTS)
    if (folder / TRAINABLE_FILE).is_file():  # a LoRA run's: its LoRA weights on the base model
        model = merged_from_state(ModelSpec(**meta["spec"]), folder, device)
    else:
        model = freeze(load_base_model(str(folder), device))
    return SamplingClient(model, load_tokenizer(str(meta["base_model"])), str(meta["base_model"]), path)
