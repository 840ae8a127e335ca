"""Checking in-flight weight updates by hand: hold the decoding thread at a known step, and the
logprobs a sequence gets when decoded in two pieces (old weights, then new ones)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch


def pause_after(model: Any, calls: int) -> tuple[threading.Event, threading.Event, Any]:
    """A forward hook on ``model`` that, after its ``calls``-th forward pass, signals ``reached`` and
    holds the decoding thread until ``go`` is set (so new weights land at a known step)."""
    reached, go, seen = threading.Event(), threading.Event(), [0]

    def hook(module: Any, args: Any, kwargs: Any, output: Any) -> None:
        seen[0] += 1
        if seen[0] == calls:
            reached.set()
            assert go.wait(120), "the test never published the new weights"

    return reached, go, model.register_forward_hook(hook, with_kwargs=True)


@torch.inference_mode()
def by_hand(old: Any, new: Any, prompt: list[int], tokens: list[int], k: int, recompute: bool) -> np.ndarray:
    """Logprobs of ``tokens`` decoded in two pieces: ``tokens[:k]`` under ``old``, the rest under
    ``new`` — over ``old``'s cache of prompt + tokens[:k-1] when kept, else over ``new``'s own."""
    ids = torch.tensor([prompt + tokens])
    n = len(prompt)
    first = torch.log_softmax(old(input_ids=ids[:, : n + k - 1]).logits[0].float(), -1)
    if recompute:
        second = torch.log_softmax(new(input_ids=ids[:, :-1]).logits[0].float(), -1)[n + k - 1 :]
    else:
        cache = old(input_ids=ids[:, : n + k - 1], use_cache=True).past_key_values
        out = new(input_ids=ids[:, n + k - 1 : -1], past_key_values=cache, use_cache=True)
        second = torch.log_softmax(out.logits[0].float(), -1)
    rows = torch.cat([first[n - 1 :], second])
    return rows.gather(-1, torch.tensor(tokens)[:, None])[:, 0].numpy()
