"""Continuous batching for the local sampler: concurrent requests share one forward pass per step.

Every sampled sequence is one row of a running batch with a left-padded KV cache (transformers'
``DynamicCache``). A request that arrives while others are decoding is prefilled on its own (its
prompt once, then its cache rows repeated for ``num_samples``) and joins the batch at the next step:
both caches are left-padded to one length and stacked. A row that stops is masked out and dropped
when the batch is next compacted, and a request's result is handed back as soon as all its rows have
stopped. Each request keeps its own sampling parameters, seed, stop conditions and top-k logprobs, so
results follow the same rules as sampling it alone (:func:`tinkertrace.engine.decoding.generate_one`
is the one-request reference the tests compare with). The thread runs while there is work and
stops after :data:`IDLE_EXIT_S` without any, so a sampler that is no longer used holds no thread.

In-flight weight updates: :meth:`ContinuousBatcher.update_weights` hands the batcher new weights and
the policy version they are; the decoding thread takes them between two steps, so every running
sequence continues on the new weights from its next token. Every sampled token records the version
of the weights whose distribution it was drawn from (its logprob is that distribution's), and the
sequences come back as :class:`~tinkertrace.engine.decoding.VersionedSequence`. The running rows'
KV cache, computed under the old weights, is kept (``recompute=False``, the default: no extra work,
the cache is slightly off-policy) or recomputed under the new weights (one prefill pass over each
row's prompt and tokens so far); ``benchmarks/inflight_cache.py`` measures both.

The thread is a daemon (a process never waits on a sampler to exit), and so must be stopped before the
interpreter finalizes: a daemon thread still inside torch then is unwound through C++ frames that
cannot unwind, and the process aborts ("terminate called without an active exception", SIGABRT,
exit 134). :func:`close_all` stops every live batcher, failing what it was decoding; it runs at exit
(``atexit`` handlers run before finalization), after the owners' own ``close`` calls.

Why not transformers' own continuous batching (``generate_batch`` / ``init_continuous_batching``):
in transformers 5.23 it takes one generation config for all requests (one ``num_return_sequences``,
no per-request seed), and reports log-probabilities after its logits processors, while Tinker's
``sample`` needs per-request ``num_samples``, seeds, stop strings and the log-probabilities of the
distribution before top-k/top-p truncation.
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np
import torch
from tinker import types
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from tinkertrace.engine.decoding import DecodeRequest, sample_next, sequences_of
from tinkertrace.engine.kv_batch import Batch, compact, stack

MAX_ROWS = 64
"""Sequences decoded together at most; further requests wait for rows to free up."""

IDLE_EXIT_S = 2.0
"""Seconds the decoding thread waits for new work before it exits (it restarts on the next submit)."""

_Item = tuple[DecodeRequest, "Future[list[types.SampledSequence]]"]


class SamplerClosedError(RuntimeError):
    """The sampler was closed while this request was waiting or being decoded."""


@dataclass
class _Running:
    """One request in the batch: its rows' outputs so far."""

    request: DecodeRequest
    future: Future[list[types.SampledSequence]]
    generator: torch.Generator
    tokens: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)
    versions: list[list[int]] = field(default_factory=list)  # per token: the policy version that sampled it
    top_ids: list[list[np.ndarray]] = field(default_factory=list)
    top_values: list[list[np.ndarray]] = field(default_factory=list)
    stopped: np.ndarray = field(init=False)  # per row: stopped by a stop condition
    done_rows: np.ndarray = field(init=False)  # per row: finished (stopped or out of tokens)

    def __post_init__(self) -> None:
        n = self.request.num_samples
        self.tokens = [[] for _ in range(n)]
        self.logprobs = [[] for _ in range(n)]
        self.versions = [[] for _ in range(n)]
        self.top_ids = [[] for _ in range(n)]
        self.top_values = [[] for _ in range(n)]
        self.stopped = np.zeros(n, dtype=bool)
        self.done_rows = np.zeros(n, dtype=bool)


@dataclass(frozen=True)
class _Update:
    """New weights waiting for the decoding thread to take them between two steps."""

    model: PreTrainedModel
    version: int
    recompute: bool


class ContinuousBatcher:
    """A background thread decoding every submitted request in one shared batch."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        max_rows: int = MAX_ROWS,
        *,
        version: int = 0,
    ) -> None:
        self._model = model
        self.version = version  # the policy version of the weights sampling now (recorded per token)
        self._update: _Update | None = None  # set by update_weights, taken by the decoding thread
        self._tokenizer = tokenizer
        self._max_rows = max_rows
        self._device = next(model.parameters()).device
        self._generator = torch.Generator(device=self._device)
        self._generator.seed()
        self._pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self._inbox: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._waiting: list[_Item] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._cancelled = False  # close(cancel=True): fail the requests in flight, stop at the next step
        self.prefills = 0  # prefill passes (each admits every request waiting at that moment)
        self.steps = 0  # decoding steps run (forward passes of the running batch)
        self.rows_stepped = 0  # sum over steps of the live rows: rows_stepped / steps is the batch fill
        self.updates = 0  # weight updates taken
        self.recomputes = 0  # cache recompute passes (update_weights with recompute)
        _LIVE.add(self)

    def submit(self, request: DecodeRequest) -> Future[list[types.SampledSequence]]:
        """Queue ``request``; the future gets its sampled sequences (or the error it raised)."""
        future: Future[list[types.SampledSequence]] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("this sampler is closed")
            self._inbox.put((request, future))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="tinkertrace-decoder", daemon=True)
                self._thread.start()
        return future

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def model(self) -> PreTrainedModel:
        """The weights sampling now (new weights once the decoding thread has taken them)."""
        return self._model

    def update_weights(self, model: PreTrainedModel, version: int, recompute: bool = False) -> None:
        """Sample with ``model`` (policy ``version``) from the next step on, running sequences included:
        their cache is kept, or with ``recompute`` rebuilt under ``model`` first. A later update before
        the thread took this one replaces it."""
        update = _Update(model, int(version), recompute)
        with self._lock:
            if self._thread is None:  # nothing decoding: take it now
                self._take(update, None)
            else:
                self._update = update

    def close(self, cancel: bool = False) -> None:
        """Stop the thread: after finishing the requests already submitted, or with ``cancel`` after the
        current forward pass, failing every unfinished request with :class:`SamplerClosedError`."""
        with self._lock:
            self._closed = True
            self._cancelled |= cancel
            thread = self._thread
            self._inbox.put(None)
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    # --- the decoding thread ------------------------------------------------------------------------
    def _loop(self) -> None:
        batch: Batch | None = None
        closing = False
        while True:
            if self._cancelled:
                self._fail_unfinished(batch)
                return
            idle = batch is None and not self._waiting
            closing |= self._drain(wait_s=None if closing or not idle else IDLE_EXIT_S)
            if batch is None and not self._waiting:
                with self._lock:
                    if closing or self._inbox.empty():
                        self._thread = None
                        if self._update is not None:
                            self._take(self._update, None)
                        return
                continue
            try:
                with torch.inference_mode():
                    with self._lock:
                        update, self._update = self._update, None
                    if update is not None:
                        batch = self._take(update, batch)
                    batch = self._admit(batch)
                    if batch is not None:
                        batch = self._step(batch)
            except Exception as exc:  # a failed forward pass fails the requests in it, not the thread
                for running in {id(r): r for r, _ in batch.owners}.values() if batch else ():
                    if not running.future.done():
                        running.future.set_exception(exc)
                batch = None

    def _take(self, update: _Update, batch: Batch | None) -> Batch | None:
        """Sample with the update's weights from now on (between two steps, or with nothing running)."""
        self._model, self.version = update.model, update.version
        self.updates += 1
        if batch is not None and update.recompute and batch.live.any():
            batch = self._recompute(compact(batch))
        return batch

    def _recompute(self, batch: Batch) -> Batch:
        """Rebuild the running rows' cache under the current weights: one left-padded forward pass over
        each row's prompt and sampled tokens but the last (the next input, not yet in the cache)."""
        rows = [r.request.prompt + r.tokens[row][:-1] for r, row in batch.owners]
        ids, mask = self._left_padded(rows)
        cache = DynamicCache()
        self._model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.recomputes += 1
        batch.cache, batch.mask = cache, mask
        return batch

    def _left_padded(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and attention mask of ``rows``, left-padded to the longest."""
        length = max(len(r) for r in rows)
        ids = torch.full((len(rows), length), self._pad, dtype=torch.long, device=self._device)
        mask = torch.zeros((len(rows), length), dtype=torch.long, device=self._device)
        for i, r in enumerate(rows):
            ids[i, length - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[i, length - len(r) :] = 1
        return ids, mask

    def _fail_unfinished(self, batch: Batch | None) -> None:
        """Fail every request still running or waiting (the sampler is closing with cancel)."""
        with self._lock:
            self._thread = None
            self._drain(wait_s=None)
        error = SamplerClosedError("the sampler was closed before this request finished")
        running = [r.future for r, _ in batch.owners] if batch is not None else []
        for future in running + [future for _, future in self._waiting]:
            if not future.done():
                future.set_exception(error)
        self._waiting.clear()

    def _drain(self, wait_s: float | None) -> bool:
        """Move submitted requests to the waiting list (waiting up to ``wait_s`` for the first one);
        True once ``close`` was called."""
        closing = False
        try:
            item = self._inbox.get(timeout=wait_s) if wait_s else self._inbox.get_nowait()
            while True:
                if item is None:
                    closing = True
                else:
                    self._waiting.append(item)
                item = self._inbox.get_nowait()
        except queue.Empty:
            return closing

    def _admit(self, batch: Batch | None) -> Batch | None:
        """Prefill waiting requests that fit and stack them onto the running batch."""
        rows = 0 if batch is None else int(batch.live.sum())
        joining: list[_Item] = []
        while self._waiting and (rows == 0 or rows + self._waiting[0][0].num_samples <= self._max_rows):
            request, future = self._waiting.pop(0)
            if future.set_running_or_notify_cancel():
                joining.append((request, future))
                rows += request.num_samples
        if not joining:
            return batch
        if batch is not None:
            batch = compact(batch)
        try:
            new = self._prefill(joining)
        except Exception as exc:  # e.g. a token id outside the vocabulary: fails the joining requests only
            for _, future in joining:
                future.set_exception(exc)
            return batch
        return new if batch is None else stack(batch, new)

    def _prefill(self, joining: list[_Item]) -> Batch:
        """One left-padded forward pass over the new prompts; sample each request's first tokens."""
        ids, mask = self._left_padded([r.prompt for r, _ in joining])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        self.prefills += 1
        cache = DynamicCache()
        out = self._model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        last = out.logits[:, -1].float()
        repeats = torch.tensor([r.num_samples for r, _ in joining], device=self._device)
        for layer in cache.layers:
            layer.keys = layer.keys.repeat_interleave(repeats, dim=0)
            layer.values = layer.values.repeat_interleave(repeats, dim=0)
        owners: list[tuple[_Running, int]] = []
        for request, future in joining:
            running = _Running(request, future, request.new_generator(self._device))
            owners += [(running, row) for row in range(request.num_samples)]
        batch = Batch(
            owners=owners,
            cache=cache,
            mask=mask.repeat_interleave(repeats, dim=0),
            positions=torch.tensor(
                [len(r.prompt) for r, _ in joining], dtype=torch.long, device=self._device
            ).repeat_interleave(repeats),
            next_tokens=torch.zeros(len(owners), dtype=torch.long, device=self._device),
            live=np.ones(len(owners), dtype=bool),
        )
        self._sample(batch, last.repeat_interleave(repeats, dim=0))
        return batch

    def _step(self, batch: Batch) -> Batch | None:
        """One forward pass of every row's last token; sample the next ones; finish done requests."""
        if not batch.live.any():
            return None
        if batch.live.mean() < 0.5:
            batch = compact(batch)
        batch.mask = torch.cat([batch.mask, torch.ones_like(batch.mask[:, :1])], dim=1)
        out = self._model(
            input_ids=batch.next_tokens.unsqueeze(-1),
            attention_mask=batch.mask,
            position_ids=batch.positions.unsqueeze(-1),
            past_key_values=batch.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        batch.positions = batch.positions + 1
        self.steps += 1
        self.rows_stepped += int(batch.live.sum())
        self._sample(batch, out.logits[:, -1].float())
        return batch if batch.live.any() else None

    def _sample(self, batch: Batch, logits: torch.Tensor) -> None:
        """Sample each live row's next token with its request's parameters and record it.

        Rows of unseeded requests with the same parameters are sampled together (one draw from the
        batcher's generator); a seeded request draws from its own generator, as it would alone."""
        groups: dict[object, tuple[DecodeRequest, torch.Generator, list[int]]] = {}
        for index in np.flatnonzero(batch.live).tolist():
            running = batch.owners[index][0]
            request = running.request
            p = request.params
            key = id(running) if p.seed is not None else (p.temperature, p.top_k, p.top_p, request.topk)
            generator = running.generator if p.seed is not None else self._generator
            groups.setdefault(key, (request, generator, []))[2].append(index)
        for request, generator, indices in groups.values():
            picked = sample_next(logits[indices], request, generator)
            batch.next_tokens[indices] = picked.tokens
            for j, (index, token, logprob) in enumerate(
                zip(indices, picked.tokens.tolist(), picked.logprobs.tolist(), strict=True)
            ):
                running, row = batch.owners[index]
                running.tokens[row].append(token)
                running.logprobs[row].append(logprob)
                running.versions[row].append(self.version)
                if picked.top_ids is not None and picked.top_values is not None:
                    running.top_ids[row].append(picked.top_ids[j])
                    running.top_values[row].append(picked.top_values[j])
                if running.request.is_stop(running.tokens[row], self._tokenizer):
                    running.stopped[row] = True
                if running.stopped[row] or len(running.tokens[row]) >= running.request.max_new:
                    running.done_rows[row] = True
                    batch.live[index] = False
                    if running.done_rows.all() and not running.future.done():
                        running.future.set_result(_finish(running))


_LIVE: weakref.WeakSet[ContinuousBatcher] = weakref.WeakSet()
"""Every batcher not yet garbage-collected, for :func:`close_all`."""


@atexit.register
def close_all() -> None:
    """Stop every live batcher's thread, failing the requests it was decoding (see the module's text)."""
    for batcher in list(_LIVE):
        batcher.close(cancel=True)


def _finish(running: _Running) -> list[types.SampledSequence]:
    return sequences_of(
        running.tokens,
        running.logprobs,
        running.stopped,
        running.top_ids,
        running.top_values,
        running.versions,
    )
