"""One sampling request's rules, shared by the one-request reference loop and the continuous batcher.

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
from dataclasses import dataclass, field

import numpy as np
import torch
from tinker import types
from tinker.types.topk_logprobs import TopkLogprobs
from transformers import PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_MAX_TOKENS = 256
"""Tokens generated when ``SamplingParams.max_tokens`` is None."""


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


def filter_logprobs(logprobs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
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


@dataclass(frozen=True)
class DecodeRequest:
    """A validated ``sample`` call: prompt, number of samples, parameters and stop conditions."""

    prompt: list[int]
    num_samples: int
    params: types.SamplingParams
    topk: int
    max_new: int
    stop_ids: frozenset[int]
    stop_strings: tuple[str, ...]

    @classmethod
    def build(
        cls,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        prompt: list[int],
        num_samples: int,
        params: types.SamplingParams,
        topk: int = 0,
    ) -> DecodeRequest:
        """Check the request against the model (ValueError names what is wrong)."""
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
        stop_ids, stop_strings = stop_conditions(params.stop, tokenizer)
        return cls(
            prompt=list(prompt),
            num_samples=num_samples,
            params=params,
            topk=topk,
            max_new=min(max_new, room),
            stop_ids=frozenset(stop_ids),
            stop_strings=tuple(stop_strings),
        )

    def new_generator(self, device: torch.device) -> torch.Generator:
        """The request's random generator: seeded when ``params.seed`` is set."""
        generator = torch.Generator(device=device)
        if self.params.seed is not None:
            generator.manual_seed(int(self.params.seed))
        else:
            generator.seed()
        return generator

    def is_stop(self, tokens: list[int], tokenizer: PreTrainedTokenizerBase) -> bool:
        """Whether the row's last token ends it (a stop id, or a stop string now in the decoded tail)."""
        if tokens[-1] in self.stop_ids:
            return True
        if not self.stop_strings:
            return False
        tail = max(len(s) for s in self.stop_strings) + 4
        text = tokenizer.decode(tokens[-tail:])
        return any(s in text for s in self.stop_strings)


@dataclass
class Picked:
    """The tokens sampled for some rows, with their logprobs and optional top-k alternatives."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    top_ids: np.ndarray | None
    top_values: np.ndarray | None


def sample_next(logits: torch.Tensor, request: DecodeRequest, generator: torch.Generator) -> Picked:
    """Sample one token per row of ``logits`` ([rows, vocab], float32) under ``request``'s parameters."""
    params = request.params
    if params.temperature == 0:
        lp = torch.log_softmax(logits, dim=-1)
        tok = lp.argmax(dim=-1)
    else:
        lp = torch.log_softmax(logits / params.temperature, dim=-1)
        probs = filter_logprobs(lp, params.top_k, params.top_p).exp()
        tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    chosen = lp.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
    top_ids = top_values = None
    if request.topk:
        values, ids = torch.topk(lp, request.topk, dim=-1)
        top_ids, top_values = ids.cpu().numpy().astype(np.int32), values.cpu().numpy()
    return Picked(tok, chosen, top_ids, top_values)


@dataclass(frozen=True)
class VersionedSequence(types.SampledSequence):
    """A Tinker ``SampledSequence`` that also names, per token, the policy version whose weights
    sampled it (``policy_versions_np``, int64, aligned with ``tokens_np``)."""

    policy_versions_np: np.ndarray | None = field(default=None, repr=False)

    @property
    def policy_versions(self) -> list[int] | None:
        return None if self.policy_versions_np is None else self.policy_versions_np.tolist()


def sequences_of(
    tokens: list[list[int]],
    logprobs: list[list[float]],
    stopped: np.ndarray,
    top_ids: list[list[np.ndarray]],
    top_values: list[list[np.ndarray]],
    versions: list[list[int]] | None = None,
) -> list[types.SampledSequence]:
    """Tinker ``SampledSequence`` objects for finished rows (:class:`VersionedSequence` with
    ``versions``, the policy version of each token)."""
    return [
        VersionedSequence(
            policy_versions_np=None if versions is None else np.asarray(versions[i], dtype=np.int64),
            stop_reason="stop" if stopped[i] else "length",
            sequence_id=uuid.uuid4().hex,
            tokens_np=np.asarray(tokens[i], dtype=np.int32),
            logprobs_np=np.asarray(logprobs[i], dtype=np.float32),
            topk_logprobs_np=TopkLogprobs(token_ids=np.stack(top_ids[i]), logprobs=np.stack(top_values[i]))
            if top_ids[i]
            else None,
        )
        for i in range(len(tokens))
    ]


@torch.inference_mode()
def generate_one(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, request: DecodeRequest
) -> list[types.SampledSequence]:
    """The reference: sample one request alone (its samples as one batch over one shared prompt pass).

    Same rules and the same random draws as the continuous batcher gives it (rows that stopped are
    not sampled again), up to float rounding of the batched forward pass."""
    device = next(model.parameters()).device
    generator = request.new_generator(device)
    n = request.num_samples
    ids = torch.tensor(request.prompt, dtype=torch.long, device=device).unsqueeze(0)
    out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
    past = out.past_key_values
    past.batch_repeat_interleave(n)
    logits = out.logits[:, -1].float().expand(n, -1)
    tokens: list[list[int]] = [[] for _ in range(n)]
    logprobs: list[list[float]] = [[] for _ in range(n)]
    top_ids: list[list[np.ndarray]] = [[] for _ in range(n)]
    top_values: list[list[np.ndarray]] = [[] for _ in range(n)]
    stopped = np.zeros(n, dtype=bool)
    next_tokens = torch.zeros(n, dtype=torch.long, device=device)
    for _ in range(request.max_new):
        live = np.flatnonzero(~stopped)
        picked = sample_next(logits[live], request, generator)
        next_tokens[live] = picked.tokens
        for j, row in enumerate(live.tolist()):
            tokens[row].append(int(picked.tokens[j]))
            logprobs[row].append(float(picked.logprobs[j]))
            if picked.top_ids is not None and picked.top_values is not None:
                top_ids[row].append(picked.top_ids[j])
                top_values[row].append(picked.top_values[j])
            stopped[row] = request.is_stop(tokens[row], tokenizer)
        if stopped.all() or len(tokens[live[0]]) == request.max_new:
            break
        out = model(
            input_ids=next_tokens.unsqueeze(-1), past_key_values=past, use_cache=True, logits_to_keep=1
        )
        past, logits = out.past_key_values, out.logits[:, -1].float()
    return sequences_of(tokens, logprobs, stopped, top_ids, top_values)
