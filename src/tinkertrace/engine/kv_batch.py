"""The continuous batcher's running batch: rows, their left-padded KV cache (transformers'
``DynamicCache``) and attention mask, and the two operations on it, dropping finished rows
(:func:`compact`) and stacking a newly prefilled batch onto the running one (:func:`stack`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache


@dataclass
class Batch:
    """The running batch: per-row owner, cache, attention mask and next input token."""

    owners: list[tuple[Any, int]]  # (request, row index within it) per batch row
    cache: DynamicCache
    mask: torch.Tensor  # [B, L] 1 for real tokens
    positions: torch.Tensor  # [B] position of each row's next input token
    next_tokens: torch.Tensor  # [B]
    live: np.ndarray  # [B] bool


def compact(batch: Batch) -> Batch:
    """Drop stopped rows and the leading cache columns no remaining row attends to."""
    keep = np.flatnonzero(batch.live)
    if len(keep) == len(batch.live):
        index = None
    else:
        index = torch.from_numpy(keep).to(batch.mask.device)
        batch.cache.batch_select_indices(index)
        batch.mask = batch.mask[index]
        batch.positions = batch.positions[index]
        batch.next_tokens = batch.next_tokens[index]
        batch.owners = [batch.owners[i] for i in keep]
        batch.live = batch.live[keep]
    used = batch.mask.any(dim=0).nonzero()
    start = int(used[0]) if len(used) else batch.mask.shape[1]
    if start > 0:
        batch.mask = batch.mask[:, start:]
        for layer in batch.cache.layers:
            layer.keys = layer.keys[:, :, start:]
            layer.values = layer.values[:, :, start:]
    return batch


def _left_pad(tensor: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    missing = length - tensor.shape[dim]
    if missing <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)


def stack(old: Batch, new: Batch) -> Batch:
    """One batch of both: caches and masks left-padded to a common length, rows concatenated."""
    length = max(old.mask.shape[1], new.mask.shape[1])
    for a, b in zip(old.cache.layers, new.cache.layers, strict=True):
        a.keys = torch.cat([_left_pad(a.keys, length, 2), _left_pad(b.keys, length, 2)], dim=0)
        a.values = torch.cat([_left_pad(a.values, length, 2), _left_pad(b.values, length, 2)], dim=0)
    return Batch(
        owners=old.owners + new.owners,
        cache=old.cache,
        mask=torch.cat([_left_pad(old.mask, length, 1), _left_pad(new.mask, length, 1)], dim=0),
        positions=torch.cat([old.positions, new.positions]),
        next_tokens=torch.cat([old.next_tokens, new.next_tokens]),
        live=np.concatenate([old.live, new.live]),
    )
