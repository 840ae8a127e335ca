"""The local SamplingClient: `sample` and `compute_logprobs` over a frozen model snapshot.

Concurrent `sample` calls, with different prompts or the same, are decoded together by one
:class:`~tinkertrace.engine.continuous.ContinuousBatcher` (one forward pass per step for all of
them); each follows the rules of :mod:`tinkertrace.engine.decoding` (log-probabilities of the
distribution sampled from, stop tokens and strings, seeds).
"""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np
import torch
from tinker import types
from tinker.lib.public_interfaces.api_future import APIFuture, AwaitableConcurrentFuture
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tinkertrace.engine.continuous import ContinuousBatcher
from tinkertrace.engine.decoding import DecodeRequest
from tinkertrace.engine.futures import OrderedWorker
from tinkertrace.engine.model import freeze, load_base_model
from tinkertrace.engine.storage import SAMPLER_WEIGHTS, CheckpointStore
from tinkertrace.tokenizer import load_tokenizer


def prompt_tokens(prompt: types.ModelInput) -> list[int]:
    """The token ids of a text-only ModelInput; ValueError for image or other chunks."""
    for chunk in prompt.chunks:
        if not isinstance(chunk, types.EncodedTextChunk):
            raise ValueError(f"the local engine takes token chunks only, got a {type(chunk).__name__}")
    tokens = prompt.to_ints()
    if not tokens:
        raise ValueError("prompt is empty")
    return tokens


@torch.inference_mode()
def token_logprobs(model: PreTrainedModel, tokens: list[int]) -> np.ndarray:
    """Log-probability of each token given the ones before it (length len(tokens) - 1)."""
    device = next(model.parameters()).device
    ids = torch.tensor([tokens], dtype=torch.long, device=device)
    logits = model(input_ids=ids[:, :-1]).logits.float()
    lp = -torch.nn.functional.cross_entropy(logits[0], ids[0, 1:], reduction="none")
    return lp.cpu().numpy()


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
        self.decoder = ContinuousBatcher(model, tokenizer)

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
        """Generate ``num_samples`` completions of ``prompt``; a future of a `SampleResponse`."""
        if topk_prompt_logprobs or target_prompt_logprobs is not None:
            raise ValueError("top-k and target prompt logprobs are not supported by the local engine")
        if prompt_alt_tokens_k:
            raise ValueError("prompt_alt_tokens_k is not supported by the local engine")
        tokens = prompt_tokens(prompt)
        response: Future[types.SampleResponse] = Future()
        try:  # a bad request fails its future, as a hosted call would
            request = DecodeRequest.build(
                self._model, self._tokenizer, tokens, num_samples, sampling_params, topk_sample_logprobs
            )
        except ValueError as exc:
            response.set_exception(exc)
            return AwaitableConcurrentFuture(response)
        decoded = self.decoder.submit(request)
        if include_prompt_logprobs:
            return self._worker.submit(self._with_prompt_logprobs, decoded, tokens, prompt_logprobs_last_n)

        def respond(done: Future[list[types.SampledSequence]]) -> None:
            if (exc := done.exception()) is not None:
                response.set_exception(exc)
            else:
                response.set_result(types.SampleResponse(sequences=done.result()))

        decoded.add_done_callback(respond)
        return AwaitableConcurrentFuture(response)

    def _with_prompt_logprobs(
        self, decoded: Future[list[types.SampledSequence]], tokens: list[int], last_n: int | None
    ) -> types.SampleResponse:
        prompt_lp = self._prompt_logprobs(tokens, last_n)
        return types.SampleResponse(sequences=decoded.result(), prompt_logprobs_np=prompt_lp)

    def _prompt_logprobs(self, tokens: list[int], last_n: int | None) -> np.ndarray:
        if last_n is not None and not 1 <= last_n <= len(tokens) - 1:
            raise ValueError(f"prompt_logprobs_last_n must be in [1, {len(tokens) - 1}], got {last_n}")
        out = np.full(len(tokens), np.nan, dtype=np.float32)
        if len(tokens) > 1:
            out[1:] = token_logprobs(self._model, tokens)
        if last_n is not None:
            out[: len(tokens) - last_n] = np.nan
        return out

    def compute_logprobs(
        self, prompt: types.ModelInput, prompt_logprobs_last_n: int | None = None
    ) -> APIFuture[list[float | None]]:
        """Log-probability of each prompt token given those before it; None for the first."""
        tokens = prompt_tokens(prompt)

        def run() -> list[float | None]:
            arr = self._prompt_logprobs(tokens, prompt_logprobs_last_n)
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
        """Finish queued requests and stop the worker threads."""
        self.decoder.close()
        self._worker.shutdown(wait=True)


def load_sampling_client(store: CheckpointStore, path: str, device: torch.device) -> SamplingClient:
    """A SamplingClient for saved sampler weights (``tinker://run/sampler_weights/name``)."""
    folder, meta = store.resolve(path, expected_kind=SAMPLER_WEIGHTS)
    model = freeze(load_base_model(str(folder), device))
    return SamplingClient(model, load_tokenizer(str(meta["base_model"])), str(meta["base_model"]), path)
